"""``xflow instruction TEXT``: show how free text maps to canonical instructions."""

from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "instruction",
        help="parse a free-text instruction and print the canonical form(s) as JSON",
        description="Parse free text ('is there fluid on the left?') into canonical MIMIC-ILS "
        "instructions. Exit status 2 with the reason when it cannot be mapped.",
    )
    p.add_argument("text", help="the instruction, e.g. 'Segment the effusion in the left lung.'")
    p.set_defaults(func=run)


def run(args) -> int:
    from monailabel_xflow.instructions import InstructionError, parse_instructions

    try:
        found = parse_instructions(args.text)
    except InstructionError as err:
        print(f"xflow instruction: {err}", file=sys.stderr)
        return 2
    print(json.dumps([i.to_dict() for i in found], indent=2))
    return 0
