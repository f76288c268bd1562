"""Training configs: the paper's Table 7 defaults, YAML overrides, and refusals of typos."""

from pathlib import Path

import pytest
import yaml

from monailabel_xflow.training.config import DEFAULTS, ConfigError, load_config, to_dict

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_table7_defaults():
    seg = load_config("segmenter")
    assert (
        seg.learning_rate,
        seg.encoder_lr_scale,
        seg.layer_decay,
        seg.weight_decay,
        seg.grad_clip,
        seg.effective_batch,
        seg.epochs,
    ) == (1e-4, 0.6, 0.9, 0.1, 0.1, 16, 5)
    init_sft, rev_sft = load_config("init-sft"), load_config("rev-sft")
    assert (init_sft.effective_batch, init_sft.epochs, rev_sft.effective_batch, rev_sft.epochs) == (256, 15, 64, 10)
    assert init_sft.vision_lr_scale == 0.3 and (init_sft.lora_r, init_sft.lora_alpha) == (128, 256)
    assert init_sft.aux_mask_loss_weight == 0.0  # the DESIGN §12 auxiliary head is opt-in
    init_rl, rev_rl = load_config("init-rl"), load_config("rev-rl")
    assert (init_rl.learning_rate, init_rl.effective_batch, init_rl.kl_beta, init_rl.top_p) == (1e-5, 32, 0.1, 1.0)
    assert (rev_rl.learning_rate, rev_rl.effective_batch, rev_rl.kl_beta, rev_rl.top_p) == (1e-6, 64, 0.02, 0.95)
    assert init_rl.num_generations == rev_rl.num_generations == 8


@pytest.mark.parametrize("name", list(DEFAULTS))
def test_shipped_yaml_equals_defaults(name):
    assert yaml.safe_load((CONFIGS / "train" / f"{name}.yaml").read_text()) == to_dict(DEFAULTS[name]())
    assert to_dict(load_config(name, CONFIGS / "train" / f"{name}.yaml")) == to_dict(DEFAULTS[name]())


def test_yaml_and_keyword_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("epochs: 2\nlearning_rate: 3.0e-4\n")
    c = load_config("segmenter", f, max_steps=7)
    assert (c.epochs, c.learning_rate, c.max_steps) == (2, 3e-4, 7)


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("epoch: 2\n", "unknown setting"),
        ("epochs: 2.5\n", "must be int"),
        ("learning_rate: 1e-4\n", "must be float"),
        ("- 1\n", "mapping"),
    ],
)
def test_bad_files_are_refused(tmp_path, text, fragment):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        load_config("segmenter", f)


def test_unknown_trainer():
    with pytest.raises(ConfigError, match="unknown trainer"):
        load_config("init-dpo")


@pytest.mark.parametrize("name", ["cpu", "gpu1", "gpu8-fsdp"])
def test_accelerate_configs_load_in_accelerate(name):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(CONFIGS / "accelerate" / f"{name}.yaml"))
    assert cfg.num_processes == (8 if name == "gpu8-fsdp" else 1)
    assert str(cfg.distributed_type).endswith("FSDP" if name == "gpu8-fsdp" else "NO")
