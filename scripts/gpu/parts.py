"""The GPU bundle's parts: pack them (here), and on the device stash what a call carried and reassemble the model.

Standard library only: it runs on the device before anything is installed.

    python3 scripts/gpu/parts.py pack --out DIR --wheels W --data D --model FILE [--part-mib 56]
    python3 scripts/gpu/parts.py stash --bundle DIR --stash S     # copy + verify the parts present, reassemble the model
    python3 scripts/gpu/parts.py check --bundle DIR [--limit-mib 60]

A bundle is ``DIR/part1``, ``DIR/part2``, ... (each at most ``--part-mib``), each holding the same ``manifest.json``:
every file of every part with its size and sha256, and the model (its name, size, sha256 and pieces). Part 1 holds the
wheels (``wheels/``), the evaluation data (``data/``) and as much of the model as fits, so that part 1 alone serves every
step that needs no real weights; the model's remaining pieces follow in as few parts as the limit allows. The device
keeps a stash (``--stash``) across calls of one warm machine, so a model split over two calls is reassembled on the
second: ``stash`` copies the files of the parts it is given, verifies each against the manifest, and writes the model
file (verified whole) once all its pieces are there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
RECORD = "ladderize-gpu-bundle"
MIB = 2**20


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(8 * MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def pack(out: Path, wheels: Path, data: Path, model: Path, model_name: str, part_mib: float) -> dict[str, Any]:
    """Lay the parts out under ``out`` (replaced) and write the manifest into each; return the manifest."""
    limit = int(part_mib * MIB)
    if out.exists():
        shutil.rmtree(out)
    first = out / "part1"
    for source, name in ((wheels, "wheels"), (data, "data")):
        shutil.copytree(source, first / name)
    used = sum(p.stat().st_size for p in _files(first)) + 64 * 1024  # room for the manifest
    if used > limit:
        raise SystemExit(f"parts: wheels and data alone take {used / MIB:.1f} MiB, over the {part_mib:g} MiB part limit")
    size, pieces, part, offset = model.stat().st_size, [], 1, 0
    with model.open("rb") as handle:
        while offset < size:
            room = limit - used
            if room < MIB:  # start the next part
                part, used = part + 1, 64 * 1024
                continue
            chunk = handle.read(min(room, size - offset))
            name = f"model/{model.name}.{len(pieces):03d}"
            target = out / f"part{part}" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(chunk)
            pieces.append({"part": part, "file": name, "size": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
            offset, used = offset + len(chunk), used + len(chunk)
    parts = []
    for index in range(1, part + 1):
        root = out / f"part{index}"
        files = [{"file": str(p.relative_to(root)), "size": p.stat().st_size, "sha256": sha256(p)} for p in _files(root)]
        parts.append({"part": index, "files": files, "bytes": sum(f["size"] for f in files)})
    manifest = {"record": RECORD, "part_limit_mib": part_mib, "parts": parts,
                "model": {"name": model_name, "file": model.name, "size": size, "sha256": sha256(model), "pieces": pieces}}
    for index in range(1, part + 1):
        (out / f"part{index}" / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def part_dirs(bundle: Path) -> list[Path]:
    """The part folders a call carried: ``bundle`` itself when it is one, else its ``part*`` folders."""
    if (bundle / MANIFEST).is_file():
        return [bundle]
    return sorted((p for p in bundle.glob("part*") if (p / MANIFEST).is_file()), key=lambda p: int(p.name[4:] or 0))


def stash(bundle: Path, store: Path) -> dict[str, Any]:
    """Copy and verify the parts present into ``store``; reassemble the model when all its pieces are stashed."""
    found = part_dirs(bundle)
    if not found:
        raise SystemExit(f"parts: no part (a folder with {MANIFEST}) under {bundle}")
    manifest = json.loads((found[0] / MANIFEST).read_text())
    store.mkdir(parents=True, exist_ok=True)
    (store / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    carried = []
    for folder in found:
        entry = next(p for p in manifest["parts"] if p["part"] == int(folder.name[4:] or 1)) if folder.name.startswith("part") \
            else manifest["parts"][0]
        for item in entry["files"]:
            source, target = folder / item["file"], store / item["file"]
            if target.is_file() and target.stat().st_size == item["size"] and sha256(target) == item["sha256"]:
                continue
            if not source.is_file() or sha256(source) != item["sha256"]:
                raise SystemExit(f"parts: {source} is missing or does not match its sha256 in the manifest")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
        carried.append(entry["part"])
    model = manifest["model"]
    whole = store / "model" / model["file"]
    missing = [p["file"] for p in model["pieces"] if not (store / p["file"]).is_file()]
    if not missing and not (whole.is_file() and whole.stat().st_size == model["size"]):
        tmp = whole.with_name(whole.name + ".tmp")
        with tmp.open("wb") as out:
            for piece in model["pieces"]:
                with (store / piece["file"]).open("rb") as handle:
                    shutil.copyfileobj(handle, out, 8 * MIB)
        if sha256(tmp) != model["sha256"]:
            tmp.unlink()
            raise SystemExit(f"parts: the reassembled {model['file']} does not match its sha256")
        os.replace(tmp, whole)
    ready = whole.is_file() and not missing
    parts_missing = sorted({p["part"] for p in model["pieces"] if p["file"] in missing})
    return {"carried_parts": carried, "stash": str(store), "model_file": str(whole) if ready else None,
            "model_parts_missing": parts_missing}


def check(bundle: Path, limit_mib: float) -> dict[str, Any]:
    """Each part's size against the limit; the files of every part against the manifest."""
    found = part_dirs(bundle)
    manifest = json.loads((found[0] / MANIFEST).read_text())
    sizes = {f.name: sum(p.stat().st_size for p in _files(f)) for f in found}
    over = {name: size for name, size in sizes.items() if size > limit_mib * MIB}
    for folder in found:
        entry = next(p for p in manifest["parts"] if f"part{p['part']}" == folder.name)
        for item in entry["files"]:
            if sha256(folder / item["file"]) != item["sha256"]:
                raise SystemExit(f"parts: {folder / item['file']} does not match the manifest")
    if over:
        raise SystemExit(f"parts: over {limit_mib:g} MiB: {over}")
    return {"parts_mib": {name: round(size / MIB, 2) for name, size in sizes.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--wheels", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--model-name", default="smollm2-135m")
    p.add_argument("--part-mib", type=float, default=58.0)
    s = sub.add_parser("stash")
    s.add_argument("--bundle", type=Path, required=True)
    s.add_argument("--stash", type=Path, required=True)
    c = sub.add_parser("check")
    c.add_argument("--bundle", type=Path, required=True)
    c.add_argument("--limit-mib", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.verb == "pack":
        manifest = pack(args.out, args.wheels, args.data, args.model, args.model_name, args.part_mib)
        result = {"parts_mib": {f"part{p['part']}": round(p["bytes"] / MIB, 2) for p in manifest["parts"]},
                  "model_pieces": len(manifest["model"]["pieces"])}
    elif args.verb == "stash":
        result = stash(args.bundle, args.stash)
    else:
        result = check(args.bundle, args.limit_mib)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
