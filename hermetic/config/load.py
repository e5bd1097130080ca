"""hermetic.yaml: finding and reading it (``load_config``, the one loader), the schema, and the config's identity:
the sha256 of the *resolved* config (defaults filled, paths as written), the same for any key order, quoting or
style and for checkouts at different paths. The file comes with the repository: it is untrusted input.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from hermetic.core.canonical import canonical_json, sha256_hex
from hermetic.core.errors import ConfigError
from hermetic.core.paths import CONFIG_FILENAME, find_upward, inside, name_pattern, norm_relpath
from hermetic.core.reference import parse_base_reference

CONFIG_MAX_BYTES = 1 << 20  # 1 MiB: a larger hermetic.yaml is refused unread
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(rf"^{name_pattern()}$")


def is_env_name(name: str) -> bool:
    return bool(_ENV_NAME.match(name))


def size_bytes(size: str) -> int:
    """A validated size ("512m", "4g") in bytes, as Docker reads it (k, m, g are powers of 1024)."""
    unit = size[-1] if size[-1] in "bkmg" else "b"
    number = int(size[:-1] if size[-1] in "bkmg" else size)
    return number * {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]


def _check_name(v: str) -> str:
    if not _NAME.match(v):
        raise ValueError("must be lowercase letters, digits, '.', '_' or '-'")
    return v


def _check_env_names(v: dict[str, str]) -> dict[str, str]:
    for k in v:
        if not is_env_name(k):
            raise ValueError(f"{k!r} is not a valid environment variable name")
    return v


def container_path(v: str) -> str:
    """One spelling of an absolute path in the container (Linux: case-sensitive, nothing folds case), so that
    ``//opt/venv``, ``/opt/venv/.`` and ``/opt//x/../venv/`` are checked as ``/opt/venv``."""
    return posixpath.normpath("/" + v.lstrip("/"))


def _check_image_path(v: str) -> str:
    if not v.startswith("/"):
        raise ValueError("must be an absolute path inside the image")
    return container_path(v)


def _norm_path(v: str) -> str:
    if not v:
        raise ValueError("must not be empty")
    # Keep relative paths relative, so checkouts at different places hash the same.
    return norm_relpath(v)


def _check_glob(v: str) -> str:
    if not v or v.startswith("/") or "\\" in v or any(p == ".." for p in v.split("/")):
        raise ValueError("must be a relative '/'-separated glob inside the working directory (no '..')")
    return v


_SIZE = re.compile(r"[1-9][0-9]*[bkmg]?")
SIZE_MAX = 16 << 40  # 16 TiB: no size key (run.*_size, run.memory) takes more, whatever the host


def _check_size(v: str) -> str:
    # Docker's size syntax (--shm-size, tmpfs size=): a whole number, then b, k, m or g.
    v = v.lower()
    if not _SIZE.fullmatch(v):
        raise ValueError("must be a size such as 512m or 8g (a whole number, then b, k, m or g)")
    if len(v) > 20 or size_bytes(v) > SIZE_MAX:
        raise ValueError(f"at most 16384g (16 TiB, {SIZE_MAX} bytes)")
    return v


def _check_version(v: str) -> str:
    if not re.fullmatch(r"3\.\d{1,2}", v):
        raise ValueError("must be MAJOR.MINOR, e.g. '3.11'")
    return v


def _check_mount(v: str) -> str:
    if not v.startswith("/"):
        raise ValueError("must be an absolute path in the container")
    return container_path(v)


def _check_user(v: str) -> str:
    m = re.fullmatch(r"(\d+):(\d+)", v)
    if not m or int(m.group(1)) == 0:
        raise ValueError("must be a non-root UID:GID, e.g. '1000:1000'")
    return v


def _check_base(v: str) -> str:
    parse_base_reference(v)  # raises ValueError with the pin hint
    return v


def _check_sources(v: Any) -> Any:
    if isinstance(v, list):
        if not v:
            raise ValueError("an empty list reads no metrics: write none for that")
        if len(set(v)) != len(v):
            raise ValueError("names a source twice")
    return v


def _check_pids(v: int) -> int:
    if v < 8:
        raise ValueError("must be at least 8 (the container's init and the script are two already), or null for none")
    return v


def _check_memory(v: str) -> str:
    if size_bytes(v) < 6 << 20:
        raise ValueError("must be at least 6m (the Docker Engine's smallest memory limit), or null for none")
    return v


Name = Annotated[str, AfterValidator(_check_name)]
Size = Annotated[str, AfterValidator(_check_size)]
EnvMap = Annotated[dict[str, str], AfterValidator(_check_env_names)]
ImagePath = Annotated[str, AfterValidator(_check_image_path)]
HostPath = Annotated[str, AfterValidator(_norm_path)]
Glob = Annotated[str, AfterValidator(_check_glob)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PythonConfig(_Strict):
    """The interpreter inside the image that runs training."""

    path: ImagePath = "/usr/bin/python3"
    version: Annotated[str, AfterValidator(_check_version)] = "3.11"


class DeterminismConfig(_Strict):
    mode: Literal["strict", "statistical", "off"] = "strict"
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    threads: int = Field(default=1, ge=1, le=1024)
    env: EnvMap = Field(default_factory=dict)


class DatasetConfig(_Strict):
    """A dataset: read-only and verified, at its project-relative path in the working directory
    (when it lies inside the project) and at ``mount`` (when given)."""

    name: Name
    path: HostPath
    manifest: HostPath
    mount: Optional[Annotated[str, AfterValidator(_check_mount)]] = None

    @property
    def in_project(self) -> bool:
        """Whether ``path`` (normalized) lies inside the project: then the script finds it there too."""
        return not (self.path.startswith("/") or self.path == ".." or self.path.startswith("../"))


class BuildConfig(_Strict):
    """How the image is assembled; every field is part of the image's identity."""

    source_date_epoch: int = Field(default=0, ge=0)
    prefix: ImagePath = "/opt/venv"
    # gzip is a recorded, machine-dependent transform (zlib versions differ):
    # the diff_ids stay the uncompressed digests, the manifest names the gzip blobs.
    compression: Literal["none", "gzip"] = "none"
    # PEP 552 .pyc beside every installed module, compiled by the base's own interpreter
    # (docs/images.md, "Bytecode"); "none" ships sources only and compiles at every start.
    bytecode: Literal["unchecked-hash", "checked-hash", "none"] = "unchecked-hash"
    user: Annotated[str, AfterValidator(_check_user)] = "1000:1000"
    workdir: ImagePath = "/workspace"


# Files that differ every run by design: kept and hashed, never compared (TensorBoard names its event
# files by time, host and PID, and writes wall times into them).
DEFAULT_VOLATILE = ("**/events.out.tfevents.*",)


class OutputsConfig(_Strict):
    """Which files the script writes in its working directory become outputs (globs; exclude wins).
    ``volatile``: outputs kept and hashed but never compared (logs that carry a time, a host, a PID)."""

    include: list[Glob] = Field(default_factory=lambda: ["**"])
    exclude: list[Glob] = Field(default_factory=list)
    volatile: list[Glob] = Field(default_factory=lambda: list(DEFAULT_VOLATILE))
    # What the script printed (runs/<id>/logs/stdout.log) as an output that diff and replay compare: for a
    # script whose result is what it prints. Off by default: progress lines often carry times.
    stdout: bool = False


PIDS_MAX = 1 << 22  # Linux's largest pid_max

# Where hermetic reads a script's metrics (hermetic.record.metrics): the files frameworks write.
MetricSource = Literal["metrics.jsonl", "tensorboard", "lightning", "trainer"]


class RunConfig(_Strict):
    """The container of `hermetic run` (the root filesystem is read-only); not part of the image."""

    # What runs the container (docs/your-script.md, "Engines"); `--engine` overrides it for one command.
    engine: Literal["docker", "podman", "charliecloud"] = "docker"
    shm_size: Size = "1g"  # /dev/shm: PyTorch DataLoader workers hand batches over through it
    tmp_size: Size = "4g"  # the tmpfs at /tmp, which is also HOME
    # The working directory: a writable copy of the code, whose new or changed files become outputs.
    workdir_size: Size = "4g"
    outputs: OutputsConfig = Field(default_factory=lambda: OutputsConfig())
    # auto: every source found (metrics.jsonl, TensorBoard event files, Lightning's metrics.csv, the Trainer's
    # trainer_state.json and *_results.json), each metric named by its source; a list: only those; none: none.
    metrics: Annotated[Union[Literal["auto", "none"], list[MetricSource]], AfterValidator(_check_sources)] = "auto"
    # Limits that keep the host safe (docs/your-script.md, "Limits"); null: none. pids: the container's processes
    # and threads together. memory: RAM, no swap (the OOM killer ends the script, 137); /dev/shm and /tmp count.
    pids: Optional[Annotated[int, AfterValidator(_check_pids)]] = Field(default=4096, le=PIDS_MAX)
    memory: Optional[Annotated[Size, AfterValidator(_check_memory)]] = None


class HermeticConfig(_Strict):
    name: Name  # also the image's name in the store
    base: Annotated[str, AfterValidator(_check_base)]
    python: PythonConfig = Field(default_factory=PythonConfig)
    lock: HostPath = "requirements.lock"
    determinism: DeterminismConfig = Field(default_factory=DeterminismConfig)
    env: EnvMap = Field(default_factory=dict)
    datasets: list[DatasetConfig] = Field(default_factory=list)
    runs_dir: HostPath = "runs"
    build: BuildConfig = Field(default_factory=BuildConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="after")
    def _datasets_fit_the_container(self) -> "HermeticConfig":
        from hermetic.config.containerpaths import dataset_container_paths, glob_matches_dataset

        seen_names: set[str] = set()
        taken: dict[str, str] = {}  # container path -> the key that claims it
        for i, d in enumerate(self.datasets):
            if d.name in seen_names:
                raise ValueError(f"datasets[{i}].name: duplicate dataset name {d.name!r}")
            seen_names.add(d.name)
            for key, where in dataset_container_paths(i, d, workdir=self.build.workdir, prefix=self.build.prefix):
                for other, other_key in taken.items():
                    if where == other or where.startswith(other + "/") or other.startswith(where + "/"):
                        raise ValueError(f"{key}: {where} collides with {other_key} ({other})")
                taken[where] = key
        for j, glob in enumerate(self.run.outputs.include):
            hit = next((d for d in self.datasets if d.in_project and glob_matches_dataset(glob, d.path)), None)
            if hit is not None:
                raise ValueError(f"run.outputs.include[{j}]: {glob!r} reaches into dataset {hit.name!r} "
                                 f"({hit.path}/): datasets are inputs, read-only, never outputs")
        return self


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config plus where it came from."""

    model: HermeticConfig
    path: Path  # the hermetic.yaml file, absolute

    @property
    def root(self) -> Path:
        return self.path.parent

    def resolve(self, rel: str) -> Path:
        """A path from the config, made absolute against the config's directory."""
        return (self.root / rel).resolve() if not rel.startswith("/") else Path(rel)

    @property
    def lock_path(self) -> Path:
        return self.resolve(self.model.lock)

    @property
    def runs_path(self) -> Path:
        return self.resolve(self.model.runs_dir)

    def resolved(self) -> dict[str, Any]:
        return self.model.model_dump(mode="json")

    @property
    def sha256(self) -> str:
        return sha256_hex(canonical_json(self.resolved()))


def find_config(path: str | Path | None) -> Path:
    """``-C`` may name the file or its directory; without it, ./hermetic.yaml or the nearest one in a
    parent directory (so that commands work from anywhere in the project, as git's do)."""
    if not path:
        found = find_upward(Path.cwd(), CONFIG_FILENAME)
        if found is None:
            raise ConfigError(f"{Path.cwd() / CONFIG_FILENAME}: no such config file, here or in a parent "
                              "directory (make one: hermetic init; or pass -C PATH)")
        return found
    p = Path(path)
    if p.is_dir():
        p = p / CONFIG_FILENAME
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file (make one: hermetic init; or pass -C PATH)")
    return p.resolve()


def _too_big(cfg_path: Path, size: int) -> ConfigError:
    return ConfigError(f"{cfg_path}: {size} bytes; a hermetic.yaml may hold at most {CONFIG_MAX_BYTES} bytes "
                       "(1 MiB): not read")


def load_config(path: str | Path | None = None) -> LoadedConfig:
    """The config at ``path`` (see find_config), validated; read only up to CONFIG_MAX_BYTES (1 MiB): a
    larger hermetic.yaml is refused unread."""
    cfg_path = find_config(path)
    try:
        with open(cfg_path, "rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)  # never more than the bound, whatever the file is
            if len(raw) > CONFIG_MAX_BYTES:
                raise _too_big(cfg_path, max(os.fstat(f.fileno()).st_size, len(raw)))
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{cfg_path}: cannot read: {e}") from None
    return parse_config(text, cfg_path)


def parse_config(text: str, cfg_path: Path) -> LoadedConfig:
    if len(text) > CONFIG_MAX_BYTES // 4 and len(text.encode("utf-8", "surrogatepass")) > CONFIG_MAX_BYTES:
        raise _too_big(cfg_path, len(text.encode("utf-8", "surrogatepass")))
    node, data = _load_yaml(text, cfg_path)
    if not isinstance(data, dict):
        raise ConfigError(f"{cfg_path}: top level must be a mapping of keys (name, base, lock, ...)")
    try:
        model = HermeticConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        key = format_key_path(loc)
        msg = _reason(err)
        if not loc:  # a rule over several keys says which key it is about: "datasets[1].mount: ..."
            m = _KEY_PREFIX.match(msg)
            if m:
                key, msg = m.group(1), m.group(2)
                loc = tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", key))
        where = _where(cfg_path, node, loc)
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        if key:
            raise ConfigError(f"{where}: {key}: {msg}{more}") from None
        raise ConfigError(f"{where}: {msg}{more}") from None
    _refuse_secrets(model, node, cfg_path)
    refuse_outside(model, node, cfg_path.resolve())
    return LoadedConfig(model=model, path=cfg_path.resolve())


# libyaml when PyYAML has it: ten times faster on a large file, and it bounds the nesting depth itself.
_YamlLoader = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


def _load_yaml(text: str, cfg_path: Path) -> tuple[yaml.Node | None, Any]:
    """(the composed node, for error lines; the data), parsed once. Aliases are refused: a config has no
    use for them, and aliases of anchors that hold aliases expand exponentially ("billion laughs")."""
    loader = _YamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _refuse_aliases(node, text, cfg_path)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{cfg_path}:{mark.line + 1}" if mark else str(cfg_path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{cfg_path}: invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    return node, data


def _refuse_aliases(root: yaml.Node, text: str, cfg_path: Path) -> None:
    """An alias (``*name``) is the anchored node itself again in the composed graph: seen twice here. Only
    then is the text read again, as events, for the alias's own line and name."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            alias = next((e for e in yaml.parse(text, Loader=_YamlLoader) if isinstance(e, yaml.AliasEvent)), None)
            line, name = (alias.start_mark.line + 1, f"*{alias.anchor}") if alias else (node.start_mark.line + 1,
                                                                                         "an alias")
            raise ConfigError(f"{cfg_path}:{line}: invalid YAML: {name}: hermetic.yaml takes no aliases of "
                              "anchors (*name, &name): write the value out")
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack += (k, v)
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value


def _refuse_secrets(model: "HermeticConfig", node: yaml.Node | None, cfg_path: Path) -> None:
    """A secret-looking name under ``env:`` would be baked into the image, and so into hermetic.image.json
    and the provenance (files made to be committed and pushed): it is given at run time instead."""
    from hermetic.config.secretnames import is_secret_name

    for loc, env in ((("env",), model.env), (("determinism", "env"), model.determinism.env)):
        name = next((k for k in env if is_secret_name(k)), None)
        if name is not None:
            raise ConfigError(f"{_where(cfg_path, node, (*loc, name))}: {format_key_path((*loc, name))}: looks like a "
                              "secret (TOKEN, SECRET, KEY, PASSWORD or CREDENTIAL in its name), and env: is baked into "
                              f"the image and its records; leave it out of hermetic.yaml and pass it at run time: "
                              f"hermetic run --env {name} (NAME alone takes the value from this shell's environment)")


ALLOW_PATHS_ENV = "HERMETIC_ALLOW_PATHS"


def allowed_places(root: str) -> tuple[list[str], list[str]]:
    """(the project and the places HERMETIC_ALLOW_PATHS names, the same with their links followed too)."""
    extra = [p for p in os.environ.get(ALLOW_PATHS_ENV, "").split(":") if p]
    bad = next((p for p in extra if not p.startswith("/")), None)
    if bad is not None:
        raise ConfigError(f"{ALLOW_PATHS_ENV}: {bad} is not an absolute path")
    allowed = [root, *(posixpath.normpath(p) for p in extra)]
    return allowed, allowed + [os.path.realpath(p) for p in extra]


def refuse_outside(model: "HermeticConfig", node: yaml.Node | None, cfg_path: Path, source: str | None = None) -> None:
    """hermetic.yaml comes with the repository, which may be hostile: each host path it names lies inside the
    project, as written and (but for datasets, which may be links to big disks) once links are followed.
    HERMETIC_ALLOW_PATHS (absolute directories, ':'-separated) widens that from outside the repository.
    ``source``: what the error names when the config came from elsewhere (a run's record, a Slurm submission)."""
    root = str(cfg_path.parent)
    allowed, real_allowed = allowed_places(root)
    named = [(("lock",), model.lock, True), (("runs_dir",), model.runs_dir, True)]
    for i, d in enumerate(model.datasets):
        named += [(("datasets", i, "path"), d.path, False), (("datasets", i, "manifest"), d.manifest, True)]
    for loc, value, follow in named:
        full = posixpath.normpath(posixpath.join(root, value))
        real = os.path.realpath(full) if follow else full
        if any(inside(full, a) for a in allowed) and any(inside(real, a) for a in real_allowed):
            continue
        how = "" if real == full or not any(inside(full, a) for a in allowed) else f" (a link to {real})"
        raise ConfigError(f"{source or _where(cfg_path, node, loc)}: {format_key_path(loc)}: {value}{how} is "
                          f"outside the project {root}; a path hermetic.yaml names stays inside it unless you allow "
                          f"the place: {ALLOW_PATHS_ENV}=/abs/dir[:/other] in the environment")


_KEY_PREFIX = re.compile(r"^([a-z_]+(?:\[\d+\]|\.[a-z_]+)*): (.*)$", re.S)


def format_key_path(loc: tuple[Any, ...]) -> str:
    out = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
    return out[1:] if out.startswith(".") else out


def _reason(err: dict[str, Any]) -> str:
    t = err["type"]
    if t == "extra_forbidden":
        return "unknown key"
    if t == "missing":
        return "required key is missing"
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if t.endswith("_type") or t in ("int_parsing", "string_type"):
        got = type(err.get("input")).__name__
        msg = f"{msg} (got {_yaml_type(got)})"
    return msg


def _yaml_type(pytype: str) -> str:
    return {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean",
            "list": "a list", "dict": "a mapping", "NoneType": "nothing (null)"}.get(pytype, pytype)


def _where(cfg_path: Path, node: yaml.Node | None, loc: tuple[Any, ...]) -> str:
    """``FILE:LINE`` of the deepest YAML node the error location reaches (``FILE`` when none)."""
    line = None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == part:
                    nxt = v
                    line = k.start_mark.line + 1
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return f"{cfg_path}:{line}" if line else str(cfg_path)
