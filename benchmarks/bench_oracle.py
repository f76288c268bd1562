"""CPU cost of the simulated user (Algorithm 1) on 1024 x 1024 phantom lesions.

Run: ``.venv/bin/python benchmarks/bench_oracle.py [--images 6] [--size 1024]``.

The segmenter is the :class:`~monailabel_xflow.testing.ScriptedSegmenter` test double, whose
hidden object is the ground truth shifted by 3 % of the image and joined to a distractor disc, so
that trajectories need both positive and negative clicks. Its own time is measured separately and
subtracted, which leaves the algorithm's cost: distance transforms, the exclusion guard, IoUs and
box bookkeeping. Prints trajectories/s and clicks/s for the oracle alone, and the time of one
click decision with the bounding-box-cropped EDT the oracle uses against a full-image EDT
reference (what a naive implementation costs).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from common import parse_args
from scipy.ndimage import distance_transform_edt

from monailabel_xflow.data.phantom import generate_phantom
from monailabel_xflow.geometry import connected_components
from monailabel_xflow.policy.oracle import OracleClicker
from monailabel_xflow.testing import ScriptedSegmenter, disk
from monailabel_xflow.workflow.revision import simulate_trajectories

FINDINGS = ("pneumonia", "effusion", "atelectasis", "opacity", "consolidation", "edema")


class TimedSegmenter(ScriptedSegmenter):
    """The test double, timing its own ``predict`` so the oracle's share can be isolated."""

    seconds = 0.0

    def predict(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return super().predict(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


def scenes(n_images: int, size: int, seed: int):
    """``(image, finding mask, hidden object)`` per finding of ``n_images`` phantoms."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_images):
        findings = tuple(rng.choice(FINDINGS, size=2, replace=False))
        ph = generate_phantom(seed + i, size=size, findings=findings)
        for f in ph.findings:
            gt = ph.finding_mask(f)
            shift = int(0.03 * size)
            hidden = np.roll(gt, (shift, -shift), axis=(0, 1))
            rows, cols = np.nonzero(gt)
            hidden |= disk(gt.shape, rows.mean() - 0.06 * size, cols.mean(), 0.04 * size)
            out.append((ph.image, gt, hidden))
    return out


def reference_click_seconds(mask: np.ndarray, gt: np.ndarray) -> float:
    """One click decision the naive way: full-image padded EDTs of both regions, then argmax."""
    t0 = time.perf_counter()
    d_miss = distance_transform_edt(np.pad(gt & ~mask, 1))[1:-1, 1:-1]
    d_over = distance_transform_edt(np.pad(mask & ~gt, 1))[1:-1, 1:-1]
    np.argmax(d_miss if d_miss.max() >= d_over.max() else d_over)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=6, help="phantoms to draw (default 6)")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--png", help="also draw the longest trajectory to this PNG file")
    args = parse_args(parser, images=1, size=256)

    t0 = time.perf_counter()
    data = scenes(args.images, args.size, args.seed)
    print(
        f"phantoms: {args.images} at {args.size}x{args.size}, {len(data)} finding masks "
        f"({time.perf_counter() - t0:.1f} s to draw, not counted)"
    )

    oracle = OracleClicker(box_noise=0.2)
    trajs, scene_of, total, seg_s = [], [], 0.0, 0.0
    for i, (image, gt, hidden) in enumerate(data):
        seg = TimedSegmenter(hidden)
        t0 = time.perf_counter()
        found = simulate_trajectories(seg, image, gt, oracle, seed=i, min_area_px=50, keep_discarded=True)
        total += time.perf_counter() - t0
        seg_s += seg.seconds
        trajs += found
        scene_of += [i] * len(found)
    oracle_s = total - seg_s
    n_clicks = sum(len(t.steps) for t in trajs)
    reasons = {r: sum(t.stop_reason == r for t in trajs) for r in ("tau", "T", "no-click")}
    kept = sum(not t.discarded for t in trajs)
    print(
        f"trajectories: {len(trajs)} ({kept} kept, {len(trajs) - kept} discarded), {n_clicks} clicks, "
        f"stops {reasons}, mean gain {np.mean([t.gain for t in trajs]):+.3f} IoU"
    )
    print(f"wall: {total:.2f} s, of which test-double segmenter {seg_s:.2f} s")
    print(
        f"oracle alone: {oracle_s:.2f} s -> {len(trajs) / oracle_s:.1f} trajectories/s, "
        f"{n_clicks / oracle_s:.1f} clicks/s, {1000 * oracle_s / len(trajs):.0f} ms/trajectory"
    )

    # one click decision on each trajectory's first mask: cropped EDT vs full-image reference
    components = [connected_components(data[i][1], 50)[t.component_id] for t, i in zip(trajs, scene_of, strict=False)]
    pairs = [(t.initial_mask, g) for t, g in zip(trajs, components, strict=False)]
    t0 = time.perf_counter()
    for mask, gt in pairs:
        oracle.next_click(mask, gt)
    ours = (time.perf_counter() - t0) / len(pairs)
    ref = float(np.mean([reference_click_seconds(mask, gt) for mask, gt in pairs]))
    print(
        f"one click decision: {1000 * ours:.2f} ms (bbox-cropped EDT) vs {1000 * ref:.2f} ms "
        f"(full-image EDT reference), {ref / ours:.1f}x"
    )

    if args.png:
        k = max(range(len(trajs)), key=lambda j: len(trajs[j].steps))
        draw(data[scene_of[k]][0], components[k], trajs[k], args.png)
        print(f"wrote {args.png}")


def draw(image: np.ndarray, gt: np.ndarray, traj, path: str) -> None:
    """One panel per observation: the mask (red), the GT outline (green), clicks so far."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    masks, ious = traj.masks, traj.ious
    rows, cols = np.nonzero(gt | np.logical_or.reduce(masks))
    pad = 40
    r0, r1 = max(rows.min() - pad, 0), min(rows.max() + pad, gt.shape[0])
    c0, c1 = max(cols.min() - pad, 0), min(cols.max() + pad, gt.shape[1])
    fig, axes = plt.subplots(1, len(masks), figsize=(3.2 * len(masks), 3.4), squeeze=False)
    for t, ax in enumerate(axes[0]):
        ax.imshow(image[r0:r1, c0:c1], cmap="gray", vmin=0, vmax=1)
        ax.imshow(np.ma.masked_where(~masks[t][r0:r1, c0:c1], masks[t][r0:r1, c0:c1]), cmap="autumn", alpha=0.45)
        ax.contour(gt[r0:r1, c0:c1], levels=[0.5], colors="lime", linewidths=1)
        for c in traj.clicks[:t]:
            ax.plot(
                c.x * gt.shape[1] - c0,
                c.y * gt.shape[0] - r0,
                "o" if c.positive else "x",
                color="cyan" if c.positive else "magenta",
                ms=7,
                mew=2,
            )
        action = "stop" if t == len(traj.steps) else ("+" if traj.clicks[t].positive else "-") + " click"
        ax.set_title(f"M{t}  IoU {ious[t]:.2f}  -> {action}", fontsize=9)
        ax.axis("off")
    fig.suptitle(f"oracle trajectory (stop: {traj.stop_reason}); green = GT, o/x = +/- clicks", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
