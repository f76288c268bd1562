"""The XFlow policies (policy/vlm.py) on tiny random Gemma3 models saved and loaded like real ones."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from monailabel_xflow.geometry import Click, GeometryError, box_to_mask
from monailabel_xflow.instructions import Instruction, all_findings
from monailabel_xflow.policy.base import PolicyError, RevisionPolicy, RevisionState, Stage1Policy
from monailabel_xflow.policy.oracle import OracleError, OracleRevisionPolicy
from monailabel_xflow.policy.prompts import stage1_request, stage2_followup_text
from monailabel_xflow.policy.protocol import parse_stage2
from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy
from monailabel_xflow.rendering import render_observation
from monailabel_xflow.testing import STOP_TEXT, ScriptedPolicy, ScriptExhausted

LEFT = Instruction("effusion", ("left lung",))
CHEST = Instruction("pneumonia", kind="global")
BOX = (0.55, 0.5, 0.85, 0.85)
SHAPE = (48, 40)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model is ~10x faster on one thread than on a shared pair of cores."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def load(vlm, init=True, rev=True, **kw) -> VLMPolicy:
    kw.setdefault("generation", GenerationSettings(max_new_tokens=10))
    return VLMPolicy.from_pretrained(vlm.base, vlm.init if init else None, vlm.rev if rev else None, device="cpu", **kw)


@pytest.fixture(scope="module")
def policy(tiny_vlm) -> VLMPolicy:
    return load(tiny_vlm)


def radiograph(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(SHAPE).astype(np.float32)


def states(image: np.ndarray, n: int = 4) -> list[RevisionState]:
    """n observations of a mask that grows step by step, with one more click each time."""
    out, clicks = [], []
    for t in range(n):
        box = (0.55 - 0.05 * t, 0.5, 0.85, 0.85)
        mask = box_to_mask(box, SHAPE)
        out.append(RevisionState(image, LEFT, box, mask, list(clicks), render_observation(image, mask, clicks), t))
        clicks.append(Click(t % 2 == 0, 0.5 + 0.05 * t, 0.6))
    return out


def run_session(policy: VLMPolicy, image: np.ndarray, n: int = 4) -> tuple[list[str], object]:
    session = policy.start(image, LEFT, BOX)
    return [session.step(s) for s in states(image, n)], session


def logits(policy: VLMPolicy, image, instruction, adapter: str):
    import torch

    enc = policy.stage1_inputs(image, instruction)
    with policy._adapter(adapter), torch.inference_mode():
        return policy.model(
            input_ids=enc.input_ids, token_type_ids=enc.token_type_ids, pixel_values=enc.pixel_values
        ).logits[0, -1]


def spy_generate(monkeypatch, policy, outputs: list | None = None) -> list[dict]:
    """Record the keyword arguments (and, into ``outputs``, the results) of ``generate`` calls."""
    calls = []
    real = policy.model.generate

    def wrapper(**kw):
        calls.append(kw)
        out = real(**kw)
        if outputs is not None:
            outputs.append(out)
        return out

    monkeypatch.setattr(policy.model, "generate", wrapper)
    return calls


# --- contract -------------------------------------------------------------------------------


def test_policies_implement_the_protocols(policy):
    assert isinstance(policy, Stage1Policy) and isinstance(policy, RevisionPolicy)
    assert isinstance(ScriptedPolicy(), Stage1Policy) and isinstance(ScriptedPolicy(), RevisionPolicy)
    assert policy.adapters == {"init", "rev"}


def test_stage1_prompt_grounds_the_lungs_the_question_names():
    assert "ground the left lung with a box," in stage1_request(LEFT)
    assert "ground the right lung and the left lung with a box each" in stage1_request(CHEST)
    zone = Instruction("opacity", ("right lung base",))
    assert "ground the right lung with a box," in stage1_request(zone)


def test_bad_inputs_are_refused(policy, tiny_vlm, tmp_path):
    with pytest.raises(GeometryError, match=r"image values must lie in \[0, 1\]"):
        policy.stage1((radiograph(0) * 255).astype(np.uint8), LEFT)
    with pytest.raises(PolicyError, match="does not exist"):
        VLMPolicy.from_pretrained(tmp_path / "nowhere")
    session = policy.start(radiograph(0), LEFT, BOX)
    s = states(radiograph(0), 2)
    with pytest.raises(PolicyError, match="out of order"):
        session.step(s[1])
    bad = RevisionState(**{**s[0].__dict__, "observation": s[0].observation[..., 0]})
    with pytest.raises(PolicyError, match=r"\(H, W, 3\) uint8"):
        session.step(bad)
    with pytest.raises(PolicyError, match="max_new_tokens"):
        GenerationSettings(max_new_tokens=0)
    # a token budget passed where the sampling switch is (it once sampled 64 tokens in a benchmark)
    with pytest.raises(TypeError):
        GenerationSettings(16)  # type: ignore[misc]
    with pytest.raises(PolicyError, match="do_sample must be True or False, got 16"):
        GenerationSettings(do_sample=16)  # type: ignore[arg-type]


# --- adapters -------------------------------------------------------------------------------


def test_adapters_switch_and_match_single_adapter_loads(policy, tiny_vlm):
    image = radiograph(1)
    l_init, l_rev = logits(policy, image, LEFT, "init"), logits(policy, image, LEFT, "rev")
    assert not np.allclose(l_init.numpy(), l_rev.numpy(), atol=1e-3)

    first = policy.stage1(image, LEFT)
    turns, _ = run_session(policy, image)
    assert policy.stage1(image, LEFT) == first  # switched back from "rev" to "init"

    only_init = load(tiny_vlm, rev=False)
    assert only_init.adapters == {"init"}
    assert only_init.stage1(image, LEFT) == first
    only_rev = load(tiny_vlm, init=False)
    assert run_session(only_rev, image)[0] == turns
    # Stage 2 without its adapter runs the bare base model: different logits again.
    l_base = logits(only_init, image, LEFT, "rev")
    assert not np.allclose(l_base.numpy(), l_rev.numpy(), atol=1e-3)


# --- Stage 2: one growing conversation -----------------------------------------------------


def test_cache_reuse_gives_the_tokens_of_rereading(tiny_vlm, monkeypatch):
    image = radiograph(2)
    reuse, reread = load(tiny_vlm, reuse_cache=True), load(tiny_vlm, reuse_cache=False)
    calls_reuse, calls_reread = spy_generate(monkeypatch, reuse), spy_generate(monkeypatch, reread)
    a, sa = run_session(reuse, image)
    b, sb = run_session(reread, image)
    assert a == b
    assert np.array_equal(sa.input_ids.numpy(), sb.input_ids.numpy())
    # past the tiny model's 24-token sliding window, with one observation per turn
    n_soft = int((sa.input_ids == reuse.processor.tokenizer.image_token_id).sum())
    assert sa.input_ids.shape[1] > 100 and n_soft == 4 * reuse.model.config.mm_tokens_per_image
    # reuse: only the new image and the previous cache; re-reading: every image, no cache
    assert [c["pixel_values"].shape[0] for c in calls_reuse] == [1, 1, 1, 1]
    assert calls_reuse[0].get("cache") is None and all(c.get("cache") is not None for c in calls_reuse[1:])
    assert [c["pixel_values"].shape[0] for c in calls_reread] == [1, 2, 3, 4]
    assert all(c.get("cache") is None for c in calls_reread)
    for c in calls_reuse:  # token types cover the whole sequence
        assert c["token_type_ids"].shape == c["input_ids"].shape


def test_turns_append_to_the_previous_ids(policy):
    image = radiograph(3)
    session = policy.start(image, LEFT, BOX)
    seen = []
    for s in states(image, 3):
        session.step(s)
        seen.append(session.input_ids.clone())
    for before, after in pairwise(seen):
        assert after.shape[1] > before.shape[1]
        assert np.array_equal(after[:, : before.shape[1]].numpy(), before.numpy())
    # Gemma turn structure: 3 user + 3 model turns opened; every turn but the last closed once
    tok = policy.processor.tokenizer
    ids = session.input_ids[0].tolist()
    assert ids.count(tok.convert_tokens_to_ids("<start_of_turn>")) == 6
    assert ids.count(tok.convert_tokens_to_ids("<end_of_turn>")) in (5, 6)
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    assert stage2_followup_text("<start_of_image>", False).startswith("\n<start_of_turn>user\n<start_of_image>")
    assert stage2_followup_text("<start_of_image>", True).startswith("<end_of_turn>\n<start_of_turn>user\n")


def test_observations_change_the_stage2_logits(policy):
    import torch

    image = radiograph(4)
    st = states(image, 1)[0]
    session = policy.start(image, LEFT, BOX)
    session.step(st)
    n = int(torch.nonzero(session.input_ids[0] == policy.encoder.end_of_turn)[0]) + 1  # end of user turn
    ids, tti = session.input_ids[:, :n], session.token_type_ids[:, :n]
    other = render_observation(radiograph(5), st.mask, [])

    def last_logits(observation):
        pix = policy.encoder.prompt("<start_of_image>", [observation]).pixel_values
        with policy._adapter("rev"), torch.inference_mode():
            return policy.model(input_ids=ids, token_type_ids=tti, pixel_values=pix).logits[0, -1].numpy()

    assert np.allclose(last_logits(st.observation), last_logits(st.observation))
    assert np.abs(last_logits(st.observation) - last_logits(other)).max() > 1e-3


# --- Stage 1 --------------------------------------------------------------------------------


def test_images_change_the_logits(policy):
    a = logits(policy, radiograph(6), LEFT, "init")
    b = logits(policy, radiograph(7), LEFT, "init")
    a2 = logits(policy, radiograph(6), LEFT, "init")
    assert np.allclose(a.numpy(), a2.numpy())
    assert np.abs(a.numpy() - b.numpy()).max() > 1e-3


def test_stage1_many_equals_one_by_one(policy, monkeypatch):
    image = radiograph(8)
    findings = all_findings() + [LEFT, Instruction("opacity", ("left lung base",), "lesion_inference")]
    one_by_one = [policy.stage1(image, i) for i in findings]
    exact = VLMPolicy(policy.model, policy.processor, policy.generation, batch_stage1=False)
    calls = spy_generate(monkeypatch, exact)
    many = exact.stage1_many(image, findings)
    assert many == one_by_one
    # the shared prefix (with the image) was prefilled once: no generate call sees pixels
    assert len(calls) == len(findings) and all("pixel_values" not in c for c in calls)
    assert all(c["cache"] is not None for c in calls)
    assert exact.stage1_many(image, [LEFT]) == [one_by_one[-2]]
    assert exact.stage1_many(image, []) == []

    # batched decoding (the default) on the tiny model: its 24-token sliding window is shorter
    # than the prompts, where padding would count as tokens, so it takes the exact path
    calls.clear()
    assert policy.batch_stage1
    assert policy.stage1_many(image, findings) == one_by_one and len(calls) == len(findings)


def test_stage1_many_batched_is_greedy_for_every_prompt(tiny_vlm, tmp_path, monkeypatch):
    import json
    import shutil

    # the same weights with a sliding window longer than any Stage 1 sequence
    base = shutil.copytree(tiny_vlm.base, tmp_path / "base")
    config = json.loads((base / "config.json").read_text())
    config["text_config"]["sliding_window"] = 4096
    (base / "config.json").write_text(json.dumps(config))
    policy = VLMPolicy.from_pretrained(
        base, tiny_vlm.init, tiny_vlm.rev, device="cpu", generation=GenerationSettings(max_new_tokens=10)
    )
    image = radiograph(8)
    findings = all_findings() + [LEFT, Instruction("opacity", ("left lung base",), "lesion_inference")]
    one_by_one = [policy.stage1(image, i) for i in findings]
    outputs = []
    calls = spy_generate(monkeypatch, policy, outputs)
    batched = policy.stage1_many(image, findings)
    # one generate call, request padding masked between prefix and request
    assert len(calls) == 1 and calls[0]["input_ids"].shape[0] == len(findings)
    assert (calls[0]["attention_mask"] == 0).any()
    # batched kernels round differently, so on a random model's near-flat logits a near-tie
    # may flip; every token picked must still be greedy for its own prompt
    width = calls[0]["input_ids"].shape[1]
    for row, instruction in enumerate(findings):
        assert_greedy_up_to_ties(policy, policy.stage1_inputs(image, instruction), outputs[0].sequences[row, width:])
    assert sum(a == b for a, b in zip(batched, one_by_one, strict=True)) >= len(findings) - 2


def assert_greedy_up_to_ties(policy, enc, new_ids, tol: float = 1e-3):
    """Each of ``new_ids`` (up to the first end token) is within ``tol`` of the best allowed
    next-token logit of the adapter-``init`` model reading ``enc`` plus the tokens before it."""
    import torch

    new_ids = new_ids.tolist()
    ends = [k for k, t in enumerate(new_ids) if t in policy.encoder.stop_ids]
    new_ids = new_ids[: ends[0] + 1] if ends else new_ids
    n = enc.input_ids.shape[1]
    ids = torch.cat([enc.input_ids, torch.tensor([new_ids])], dim=1)
    tti = torch.cat([enc.token_type_ids, torch.zeros_like(ids[:, n:])], dim=1)
    with policy._adapter("init"), torch.inference_mode():
        logits = (
            policy.model(
                input_ids=ids, token_type_ids=tti, pixel_values=enc.pixel_values, attention_mask=torch.ones_like(ids)
            )
            .logits[0, n - 1 : -1]
            .float()
        )
        logits[:, policy._suppress_ids] = float("-inf")
    for k, token in enumerate(new_ids):
        assert logits[k, token] >= logits[k].max() - tol, (k, token, int(logits[k].argmax()))


# --- generation settings ---------------------------------------------------------------------


def test_generation_settings_are_honoured(tiny_vlm, monkeypatch):
    image = radiograph(9)
    short = load(tiny_vlm, generation=GenerationSettings(max_new_tokens=3))
    calls = spy_generate(monkeypatch, short)
    short.stage1(image, LEFT)
    assert calls[0]["max_new_tokens"] == 3 and calls[0]["do_sample"] is False
    texts = set()
    for seed in range(4):
        sampler = VLMPolicy(
            short.model,
            short.processor,
            GenerationSettings(do_sample=True, temperature=3.0, top_p=0.9, max_new_tokens=8, seed=seed),
        )
        a, b = sampler.stage1(image, LEFT), sampler.stage1(image, LEFT)
        assert a == b  # same seed, same sample
        texts.add(a)
    assert len(texts) > 1  # different seeds, different samples
    calls.clear()
    sampler.stage1(image, LEFT)
    assert calls[0]["temperature"] == 3.0 and calls[0]["top_p"] == 0.9 and calls[0]["do_sample"]


def test_image_placeholders_are_never_generated(tiny_vlm, monkeypatch):
    """A hot sampler on a random model would otherwise emit image tokens, which break the next
    forward ("image features and image tokens do not match"), e.g. in GRPO rollouts."""
    image = radiograph(9)
    sampler = load(
        tiny_vlm, generation=GenerationSettings(do_sample=True, temperature=50.0, max_new_tokens=150, seed=0)
    )
    tok = sampler.processor.tokenizer
    image_ids = {tok.convert_tokens_to_ids(t) for t in ("<image_soft_token>", "<start_of_image>", "<end_of_image>")}
    seen = []
    real = sampler.model.generate

    def wrapper(**kw):
        out = real(**kw)
        seen.append((kw, out.sequences[0, kw["input_ids"].shape[1] :].tolist()))
        return out

    monkeypatch.setattr(sampler.model, "generate", wrapper)
    for _ in range(5):
        sampler.stage1(image, LEFT)
    assert all(image_ids <= set(kw["suppress_tokens"]) for kw, _ in seen)
    generated = [t for _, new in seen for t in new]
    assert len(generated) > 400 and not image_ids & set(generated)


def test_max_new_tokens_caps_each_turn(tiny_vlm):
    image = radiograph(10)
    pol = load(tiny_vlm, generation=GenerationSettings(max_new_tokens=2))
    session = pol.start(image, LEFT, BOX)
    added = []
    for s in states(image, 3):
        before = 0 if session.input_ids is None else session.input_ids.shape[1]
        prompt = pol.encoder.prompt(
            stage2_followup_text(pol.encoder.image_token, True), [s.observation]
        ).input_ids.shape[1]
        session.step(s)
        added.append(session.input_ids.shape[1] - before - prompt)
    # later turns: the follow-up prompt (one token shorter if <end_of_turn> was generated)
    # plus at most 2 generated tokens
    assert all(n <= 2 for n in added[1:])


# --- replay and oracle ----------------------------------------------------------------------


def test_scripted_policy_replays_and_stops_when_out_of_script():
    image = radiograph(0)
    s1 = ["<think></think><answer>absent</answer>", "<think>a</think><answer>absent</answer>", "third"]
    turns = [["<think></think><click>positive (500,600)</click>", "<think></think><stop/>"], []]
    pol = ScriptedPolicy(s1, turns)
    assert pol.stage1(image, LEFT) == s1[0]
    assert pol.stage1_many(image, [CHEST, LEFT]) == s1[1:]
    with pytest.raises(ScriptExhausted):
        pol.stage1(image, LEFT)
    st = states(image, 4)
    first = pol.start(image, LEFT, BOX)
    assert [first.step(s) for s in st[:3]] == turns[0] + [STOP_TEXT]
    assert pol.start(image, LEFT, BOX).step(st[0]) == STOP_TEXT  # scripted empty session
    assert pol.start(image, LEFT, BOX).step(st[0]) == STOP_TEXT  # beyond the script
    parsed = parse_stage2(STOP_TEXT)
    assert parsed.ok and parsed.value.stop
    assert [c[0] for c in pol.calls] == ["stage1"] * 4 + ["start"] * 3


def test_oracle_revision_policy_clicks_then_stops():
    image = radiograph(0)
    gt = box_to_mask((0.2, 0.2, 0.8, 0.8), SHAPE)
    small = box_to_mask((0.2, 0.2, 0.4, 0.4), SHAPE)
    pol = OracleRevisionPolicy(gt)
    session = pol.start(image, LEFT, (0.2, 0.2, 0.4, 0.4))
    state = RevisionState(image, LEFT, (0.2, 0.2, 0.4, 0.4), small, [], render_observation(image, small, []), 0)
    parsed = parse_stage2(session.step(state))
    assert parsed.ok and parsed.value.click is not None and parsed.value.click.positive
    c = parsed.value.click
    assert gt[int(c.y * SHAPE[0]), int(c.x * SHAPE[1])] and not small[int(c.y * SHAPE[0]), int(c.x * SHAPE[1])]
    done = RevisionState(image, LEFT, BOX, gt, [c], render_observation(image, gt, [c]), 1)
    parsed = parse_stage2(session.step(done))
    assert parsed.ok and parsed.value.stop
    with pytest.raises(OracleError, match="shape"):
        session.step(RevisionState(image, LEFT, BOX, gt[:10], [], done.observation, 2))


def test_an_older_transformers_is_refused_by_name_before_any_model_loads(tmp_path, monkeypatch):
    """transformers < 5.24 lacks the ``cache`` name Stage 2 reuses: a clear error, not an
    AttributeError inside ``generate`` (the GPU machine's 5.17 showed it); setup.cfg agrees."""
    import configparser
    from pathlib import Path

    import transformers

    from monailabel_xflow.policy.vlm import MIN_TRANSFORMERS, check_transformers

    check_transformers()  # the installed release
    check_transformers(MIN_TRANSFORMERS)
    with pytest.raises(PolicyError, match=r"transformers>=5\.24, found 5\.17\.0"):
        check_transformers("5.17.0")
    monkeypatch.setattr(transformers, "__version__", "5.23.0")
    with pytest.raises(PolicyError, match="found 5.23.0"):
        VLMPolicy.from_pretrained(tmp_path)  # an empty folder: loading would raise OSError
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    requires = [r.strip() for r in cfg["options"]["install_requires"].splitlines()]
    assert f"transformers>={MIN_TRANSFORMERS},<6" in requires
