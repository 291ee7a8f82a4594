"""What every config file shares: the strict pydantic base, the one config error, YAML
reading with ``key=value`` overrides, error messages that name the key, and where the shipped
configs live. Imports no torch."""

from __future__ import annotations

import copy
import difflib
import os
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

DEFAULT_CONFIG = "quickstart.yaml"

MAX_CONFIG_BYTES = 16 * 2**20
"""Larger is no config file (the shipped ones are a few KiB): refused before it is read."""


class StrictModel(BaseModel):
    """A config section: unknown keys and out-of-range values are errors, also on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class UserError(Exception):
    """Bad input from the person running a command (a config key, a path, a dataset, a task set,
    a model name, a missing optional package): its message is one line that names the file,
    line or field, and every command prints it as ``error: ...`` and exits 2. Raised before
    any model loads where the input can be checked then (``run/preflight.py``)."""


class ConfigError(UserError, ValueError):
    """A config file or override that does not validate; the message names the key."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (YAML would keep the last
    and drop the first without a word: a section's settings, a learning rate). A key merged in
    with ``<<`` may still be set again: that is what merging is for.

    The check runs where PyYAML flattens a mapping's merge keys (`flatten_mapping`), once per
    mapping, on the keys as written: flattening rewrites a mapping in place (merged keys first),
    and a mapping merged into another one is flattened there, possibly before it is itself
    constructed; checked after that, its merged and own keys would look like duplicates."""

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        checked = self.__dict__.setdefault("_unique_checked", set())
        if id(node) not in checked:  # the first flattening sees the keys as written
            checked.add(id(node))
            self._check_unique(node)
        super().flatten_mapping(node)

    def _check_unique(self, node: yaml.MappingNode) -> None:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=False)
            if isinstance(key, typing.Hashable) and key in first:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first[key] + 1})",
                    key_node.start_mark,
                )  # fmt: skip
            if isinstance(key, typing.Hashable):
                first[key] = key_node.start_mark.line


def _load_yaml(text: str) -> Any:
    """YAML text parsed as `yaml.safe_load` does, but a duplicated key is an error."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value parsed as a YAML scalar)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({problem})") from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted ``key=value`` overrides to a nested dict (a copy is returned)."""
    out = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return out


def load_yaml_mapping(path: str | Path, what: str = "config") -> dict[str, Any]:
    """The top-level mapping of a YAML file. Every config file of the project (run, ablation,
    teacher pool) is read here; a `ConfigError` names the file, and for a YAML syntax error the
    line and column. An empty file (or one with only comments) is an error: a run on all
    defaults from a truncated or mistyped file is never what was meant."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a {what} file")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{path}: not a regular file")
    if path.is_file() and path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{path}: {path.stat().st_size / 2**20:.0f} MiB, too large for a {what} file "
            f"(at most {MAX_CONFIG_BYTES // 2**20} MiB)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the {what} file: {err}") from None
    try:
        data = _load_yaml(text)
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error_message(path, err)) from None
    if data is None:
        raise ConfigError(f"{path}: the {what} file is empty (no key: value lines)")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: top level must be a mapping (key: value lines), got {type(data).__name__}"
        )
    return data


def _yaml_error_message(path: Path, err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def home_expanded(path: str) -> str:
    """``~`` at the start of an output path is the home directory (as `check_output_dir` reads
    it), not a folder named ``~`` in the working directory: the validator of every config's
    ``output_dir``."""
    return os.path.expanduser(path)


def check_output_dir(path: str | Path, what: str) -> None:
    """Raise a `ConfigError` (``what``: the field or option, e.g. ``output_dir``) unless
    ``path`` is a directory or can be made one: not a file, and its nearest existing ancestor a
    writable directory. Called before any model loads or any work starts, so that an output
    path that cannot be written stops the command at once instead of after the work."""
    p = Path(path).expanduser().absolute()
    ancestor = next(a for a in (p, *p.parents) if a.exists() or a.is_symlink())
    if not ancestor.is_dir():
        where = "it" if ancestor == p else str(ancestor)
        raise ConfigError(f"{what} {path}: {where} exists and is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path}: {ancestor} is not writable")


def configs_dir() -> Path:
    """The shipped configs: package data (``composer_replication/configs``), so an installed
    wheel has them; a repository checkout sees the same directory as ``configs/``."""
    return Path(__file__).resolve().parents[1] / "configs"


def resolve_config_path(name: str | Path) -> Path:
    """``name`` if it is a file, else the shipped config of that name: ``quickstart.yaml``,
    ``configs/quickstart.yaml`` and ``teachers/local.yaml`` all resolve from any directory."""
    p = Path(name)
    if p.is_file():
        return p
    if p.is_dir():
        raise ConfigError(f"{name}: is a directory, not a config file")
    if p.exists():  # a FIFO, a device: reading it could block or never end
        raise ConfigError(f"{name}: not a regular file")
    shipped = Path(*p.parts[1:]) if len(p.parts) > 1 and p.parts[0] == "configs" else p
    candidate = configs_dir() / shipped
    if not p.is_absolute() and candidate.is_file():
        return candidate
    raise ConfigError(f"config file not found: {name} (nor under the shipped {configs_dir()})")


def default_config_path() -> Path:
    """The shipped ``quickstart.yaml``."""
    path = configs_dir() / DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"the default config is missing from the package: {path}; pass --config")
    return path


def format_validation_error(
    err: ValidationError,
    source: str,
    root: type[BaseModel],
    aliases: tuple[str, ...] = (),
    overrides: list[str] | tuple[str, ...] = (),
) -> str:
    """``invalid config (source):`` and one ``key: problem`` line per error; an unknown key
    gets a ``did you mean`` from its section's field names (``aliases``: extra top-level
    names of ``root``), and a key set by one of the ``key=value`` ``overrides`` names it."""
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(root)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(e["loc"], root, aliases)
        lines.append(f"  {key}: {msg}" + _from_override(e["loc"], overrides))
    return "\n".join(lines)


def _from_override(loc: tuple, overrides: list[str] | tuple[str, ...]) -> str:
    """`` (override 'a.b=1')``: the overrides that set ``loc``, a section above it or a key
    below it (``sdpo.loss.beta`` sets ``sdpo.loss.jsd.beta``: a union's tag is in the error's
    path, not in the override); "" when the value came from the file."""
    path = [str(p) for p in loc]
    if not path:  # a rule over the whole config: every override is under it, none is its cause
        return ""
    found = [
        repr(text)
        for text in overrides
        if (keys := parse_override(text)[0])[: len(path)] == path[: len(keys)]
        or _tagged(keys, path)
    ]
    if not found:
        return ""
    return f" (override{'s' if len(found) > 1 else ''} {', '.join(found)})"


def _tagged(keys: list[str], path: list[str]) -> bool:
    """``keys`` is ``path`` with some inner parts (union tags) left out."""
    if len(keys) >= len(path) or keys[0] != path[0] or keys[-1] != path[-1]:
        return False
    rest = iter(path)
    return all(k in rest for k in keys)


def _models_of(annotation: Any) -> Any:
    """The pydantic model of a field, or the list of models of a (discriminated) union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        variants = getattr(annotation, "variants", None)  # a section keyed on `name`
        return list(variants()) if variants else annotation
    found = []
    for arg in typing.get_args(annotation):
        sub = _models_of(arg)
        found.extend(sub if isinstance(sub, list) else [sub] if sub else [])
    return found


def _tag(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("type") or model.model_fields.get("name")
    return field.default if field else None


def _did_you_mean(loc: tuple, root: type[BaseModel], aliases: tuple[str, ...]) -> str:
    """``; did you mean 'x'?`` for an unknown key, from the section's field names."""
    model: Any = root
    for part in loc[:-1]:
        fields = getattr(model, "model_fields", {})
        if part in fields:
            model = _models_of(fields[part].annotation)
        else:  # a union's tag (`sdpo.loss.jsd.x`): the member whose `type` is that tag
            model = [m for m in model if _tag(m) == part]
        if isinstance(model, list):
            model = model[0] if len(model) == 1 else model
        if not model:
            return ""
    if isinstance(model, list):  # a section keyed on `name`, its variant unknown here
        names = sorted({n for m in model for n in m.model_fields})
        close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
        return f"; did you mean {close[0]!r}?" if close else ""
    names = list(model.model_fields) + (list(aliases) if model is root else [])
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
