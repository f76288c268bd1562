"""``xflow build KIND``: training sets for both policies (see training/builders.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from monailabel_xflow.commands import int_in, not_a_folder


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "build",
        help="build a training set (init-sft, rev-sft, init-rl, rev-rl) as a datasets folder",
        description="Build training examples from a dataset (MIMIC-ILS, phantoms, folders). Resumable: "
        "run the same command again after an interruption. Sharded: --shard i/N on N workers.",
    )
    p.add_argument("kind", choices=("init-sft", "rev-sft", "init-rl", "rev-rl"))
    p.add_argument(
        "--dataset", required=True, help="mimic-ils:JSON[:IMAGE_ROOT] | chexlocalize:JSON:IMAGE_ROOT | folder:DIR"
    )
    p.add_argument("--split", default="train", help="MIMIC-ILS split (default: train)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--shard", default="0/1", help="i/N: this worker builds every N-th case from the i-th")
    p.add_argument("--lung-boxes", type=Path, help="JSON of lung boxes per image (init-sft on real data)")
    p.add_argument("--segmenter", help="F_seg weights for rev-sft: local folder, .pt checkpoint or hub id")
    p.add_argument("--seed", type=int_in(0), default=0)
    p.add_argument("--chunk-size", type=int_in(1), default=256, help="rows per saved chunk (default 256)")
    p.set_defaults(func=run)


def run(args) -> int:
    import logging

    from monailabel_xflow.data.readers import DatasetError, read_dataset
    from monailabel_xflow.policy.targets import BuildError
    from monailabel_xflow.training.builders import LungBoxes, build

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        i, n = (int(v) for v in args.shard.split("/"))
    except ValueError:
        print(f"xflow build: --shard must look like 0/4, got {args.shard!r}", file=sys.stderr)
        return 2
    try:
        result = read_dataset(args.dataset, split=args.split, kinds=("basic", "global", "lesion_inference"))
    except DatasetError as err:
        print(f"xflow build: {err}", file=sys.stderr)
        return 2
    for problem in result.problems[:20]:
        print(f"xflow build: skipped: {problem}", file=sys.stderr)
    for reason, count in sorted(result.skipped.items()):
        print(f"xflow build: left out on purpose: {count} ({reason})", file=sys.stderr)
    if not result.cases:
        print(f"xflow build: no usable cases in {args.dataset}", file=sys.stderr)
        return 2
    if args.lung_boxes is not None and not args.lung_boxes.is_file():
        print(f"xflow build: --lung-boxes {args.lung_boxes} is not a file", file=sys.stderr)
        return 2
    if wrong := not_a_folder(args.out):
        print(f"xflow build: --out {wrong}", file=sys.stderr)
        return 2
    try:  # a phantom set keeps its anatomy label maps beside the MIMIC-ILS JSON (DIR/ground-truth/)
        lungs = LungBoxes.for_spec(args.dataset, args.lung_boxes)
    except BuildError as err:
        print(f"xflow build: {err}", file=sys.stderr)
        return 2
    segmenter = None
    if args.segmenter:
        from monailabel_xflow.segmenter.loading import load_segmenter

        segmenter = load_segmenter(args.segmenter)
    try:
        report = build(
            args.kind,
            result.cases,
            args.out,
            lung_boxes=lungs,
            segmenter=segmenter,
            shard=(i, n),
            seed=args.seed,
            chunk_size=args.chunk_size,
        )
    except (BuildError, DatasetError) as err:  # DatasetError: a mask that cannot be read
        print(f"xflow build: {err}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0
