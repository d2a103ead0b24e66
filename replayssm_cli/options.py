"""The options every command shares: one name, its aliases, and its type and range checked before any work.

Each factory returns the `typer.Option` of one option, for `Annotated[...]` in a command's signature. The
callbacks refuse a bad value with one line on stderr and exit code 2: empty values, NaN and
infinities, numbers out of range (the message names the range), dtype names neither ours nor the engines'.
They return the same types the commands read (canonical strings, dtype enum members, which are strings too),
so a command's body is the same with or without them. `OneValueCommand` refuses a single-valued option given
twice and the pairs of options that contradict each other.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import typer
from typer.core import TyperCommand

from replayssm_cli.model import dtypes
from replayssm_cli.errors import EXIT_USER_ERROR, UserError, debug_enabled, readable_path

MAX_BATCH = 1 << 20
MAX_WINDOW = 64
MAX_DRAFT = 8
MAX_TP = 64
# A preset name is a word; anything longer is taken for a path, whose components the OS caps at 255 bytes.
MAX_NAME = 255

_CLICK = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
_UsageError = _CLICK["UsageError"]


def _name(param: Any) -> str:
    """The option's main long name (`--preset`, not `-p`), for messages."""
    return next((o for o in getattr(param, "opts", ()) if o.startswith("--")), getattr(param, "name", "value"))


# Parsing, as plain functions the callbacks and tests share. Each raises UserError naming the option.


def split_list(values: Iterable[str] | str | None, option: str) -> list[str]:
    """The items of a comma-separated or repeated option; an empty item (`''`, `1,,2`, `1,`) is an error."""
    if values is None:
        return []
    items: list[str] = []
    for value in [values] if isinstance(values, str) else values:
        text = str(value)
        parts = [p.strip() for p in text.split(",")]
        if any(not p for p in parts):
            what = "is empty" if not text.strip() else f"has an empty item in {text!r}"
            raise UserError(f"{option} {what}", f"give one or more comma-separated values, e.g. {option} {_EXAMPLES.get(option, 'A,B')}")
        items.extend(parts)
    return items


def parse_int(text: str, option: str, lo: int, hi: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise UserError(f"{option} {text!r} is not an integer", f"it takes an integer from {lo} to {hi:,}") from None
    if not lo <= value <= hi:
        raise UserError(f"{option} {value} is " + (f"not {_NOUNS[option]}" if option in _NOUNS else "out of range"), f"it takes an integer from {lo} to {hi:,}")
    return value


def parse_float(text: Any, option: str, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> float:
    """A finite number in [lo, hi] (or open at either end); NaN, infinities and text are errors naming the range."""
    span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    try:
        value = float(str(text).strip())
    except ValueError:
        raise UserError(f"{option} {text!r} is not a number", f"it takes a number in {span}") from None
    if not math.isfinite(value):
        raise UserError(f"{option} {text} is not a finite number", f"it takes a number in {span}")
    if value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi):
        raise UserError(f"{option} {value:g} is out of range", f"it takes a number in {span}")
    return value


def int_list(values: Iterable[str] | str | None, option: str, lo: int, hi: int) -> list[int]:
    """The integers of a comma-separated or repeated option, in order, each once."""
    return list(dict.fromkeys(parse_int(p, option, lo, hi) for p in split_list(values, option)))


def ints_given(values: Iterable[str] | None, option: str) -> tuple[int, ...]:
    """The integers of a list option whose callback (`batch`, `window`, `draft`, `context`) checked them: in order, each once."""
    return tuple(int_list(values, option, -sys.maxsize, sys.maxsize)) if values else ()


def words_given(values: Iterable[str] | None) -> tuple[str, ...]:
    """The items of a comma-separated or repeated word option, in order, each once."""
    return tuple(dict.fromkeys(p.strip() for v in values or [] for p in v.split(",") if p.strip()))


def accept_weights(text: str | None, option: str = "--accept-dist") -> tuple[float, ...]:
    """`--accept-dist`: weights of accepting 0..T drafts, finite, non-negative, not all zero."""
    if text is None:
        return ()
    weights = []
    for part in split_list([text], option):
        try:
            weights.append(parse_float(part, option, 0.0, math.inf, hi_open=True))
        except UserError:
            raise UserError(f"{option} weight {part!r} is not a non-negative finite number", "e.g. --draft 2 --accept-dist 0.2,0.3,0.5") from None
    if len(weights) < 2:
        raise UserError(f"{option} {text!r} has {len(weights)} weight", "give T+1 weights, for 0..T drafts accepted, e.g. --draft 2 --accept-dist 0.2,0.3,0.5")
    if sum(weights) <= 0:
        raise UserError(f"{option} {text!r} weighs nothing", "at least one weight must be above 0")
    return tuple(weights)


def dtype_name(text: str, option: str, allowed: tuple[str, ...], *, auto: bool = False, none: bool = False) -> str:
    """Our dtype name for one of ours or the engines' (float32, bfloat16, float16, fp8_e4m3, ...)."""
    key = str(text).strip().lower()
    if auto and key == "auto":
        return "auto"
    if none and key == "none":
        return "none"
    name = dtypes.ALIASES.get(key)
    if name is None or name not in allowed:
        extra = (", auto (the preset's)" if auto else "") + (", none" if none else "")
        why = f" ({dtypes.WHY_NOT[key]})" if key in dtypes.WHY_NOT else ""
        raise UserError(f"{option} {text!r} is not a dtype it takes{why}", f"choose from {', '.join(allowed)}{extra} (or the engines' names: {dtypes.engine_names(allowed)})")
    return name


def preset_names_given(presets: Iterable[str] | None, preset_files: Iterable[Path | str] | None) -> list[str]:
    """The presets of `--preset` and `--preset-file` together, in the order given, each once."""
    return list(dict.fromkeys([*(presets or []), *(str(p) for p in preset_files or [])]))


def one_preset(presets: Iterable[str] | None, preset_files: Iterable[Path | str] | None, command: str) -> str | None:
    """The one preset a command that takes one was given; two or more are refused, never all but the last."""
    names = preset_names_given(presets, preset_files)
    if len(names) > 1:
        raise UserError(f"{command} takes one preset, got {len(names)}: {', '.join(names)}", f"run {command} once per preset")
    return names[0] if names else None


_NOUNS = {"--batch": "a batch size", "--tp": "a tensor-parallel degree", "--context": "a context length"}
_EXAMPLES = {
    "--batch": "1,64,256", "--window": "8,16", "--draft": "2,4", "--preset": "nemotron-3-super-120b-a12b",
    "--context": "4096,32768", "--state-dtype": "fp32,bf16", "--read-dtype": "bf16,fp8", "--variant": "conventional,replay",
    "--baseline": "all", "--accept-dist": "0.2,0.3,0.5", "--cohorts": "1,16,64,128,256",
}


# Callbacks: one per kind of value; a UserError in one is one line on stderr and exit code 2.


def _guard(check: Callable[[Any, Any, Any], Any]) -> Callable[..., Any]:
    def callback(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if ctx.resilient_parsing or value is None:
            return value
        try:
            return check(ctx, param, value)
        except UserError as exc:
            # Printed here, as cli_command prints a command's own errors, so any app that mounts the command says it in one line.
            if debug_enabled():
                raise
            print(f"error: {exc.line()}", file=sys.stderr)
            raise typer.Exit(EXIT_USER_ERROR) from None

    return callback


def _ints_cb(lo: int, hi: int) -> Callable[..., Any]:
    def check(ctx: Any, param: Any, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [str(v) for v in int_list(value, _name(param), lo, hi)] or None
        return parse_int(value, _name(param), lo, hi)

    return _guard(check)


def _float_cb(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Callable[..., Any]:
    return _guard(lambda ctx, param, value: parse_float(value, _name(param), lo, hi, lo_open=lo_open, hi_open=hi_open))


def _words_cb(choices: tuple[str, ...] | None = None) -> Callable[..., Any]:
    def check(ctx: Any, param: Any, value: Any) -> Any:
        option = _name(param)
        words = split_list(value if isinstance(value, (list, tuple)) else [value], option)
        if choices is not None:
            bad = [w for w in words if w.lower() not in choices]
            if bad:
                raise UserError(f"{option} {bad[0]!r} is not one it takes", f"choose from {', '.join(choices)}")
        if isinstance(value, (list, tuple)):
            return list(dict.fromkeys(words)) or None
        return words[0] if len(words) == 1 else ",".join(words)

    return _guard(check)


def _nonempty_text(ctx: Any, param: Any, value: Any) -> Any:
    if not str(value).strip():
        raise UserError(f"{_name(param)} is empty", "give a value or leave the option out")
    return value


def _preset_cb(ctx: Any, param: Any, value: Any) -> Any:
    names = split_list(value, _name(param))
    for n in names:
        if len(n) > MAX_NAME and "/" not in n:
            raise UserError(f"--preset {n[:40]!r}... ({len(n):,} characters) is neither a preset name nor a path", "see `replayssm presets` for the names")
    return list(dict.fromkeys(names)) or None


def _preset_file_cb(ctx: Any, param: Any, value: Any) -> Any:
    paths = [value] if isinstance(value, (str, Path)) else list(value)
    return [readable_path(Path(str(p)).expanduser(), "preset file", model_dir=True) for p in paths] or None


def _input_path_cb(what: str) -> Callable[..., Any]:
    def check(ctx: Any, param: Any, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [readable_path(Path(str(p)), what) for p in value] or None
        return readable_path(Path(str(value)), what)

    return _guard(check)


def _out_cb(ctx: Any, param: Any, value: Any) -> Any:
    from replayssm_cli.errors import writable_path

    if isinstance(value, (list, tuple)):
        return [writable_path(Path(str(p)), _name(param)) for p in value] or None
    return writable_path(Path(str(value)), _name(param))


def _dtype_cb(allowed: tuple[str, ...], enum: type, *, auto: str | None, none: bool = False) -> Callable[..., Any]:
    """auto=None: 'auto' refused; 'default': 'auto' means the option left out (the preset's own);
    'preset': 'auto' is replaced by the preset's state dtype (the command's --preset is read first)."""

    def member(name: str) -> Any:
        return name if name == "none" else enum(name)

    def check(ctx: Any, param: Any, value: Any) -> Any:
        option = _name(param)
        many = isinstance(value, (list, tuple))
        words = split_list(value if many else [value], option)
        names = [dtype_name(w, option, allowed, auto=auto is not None, none=none) for w in words]
        if "auto" in names:
            if len(names) > 1:
                raise UserError(f"{option} auto (the preset's own dtype) stands alone", f"give auto, or dtypes such as {option} fp32,bf16")
            if auto == "default":
                return None
            names = [_presets_dtype(ctx, option)]
        if "none" in names and len(names) > 1:
            raise UserError(f"{option} none stands alone", f"give none, or dtypes such as {option} bf16,fp8")
        out = [member(n) for n in dict.fromkeys(names)]
        return out if many else out[0]

    return _guard(check)


def _presets_dtype(ctx: Any, option: str) -> str:
    """The state dtype of the one preset the command was given (for `auto`)."""
    from replayssm_cli.model import presets as presets_mod

    names = preset_names_given(ctx.params.get("preset"), ctx.params.get("preset_file"))
    if len(names) != 1:
        raise UserError(f"{option} auto means the preset's own dtype and needs one --preset", "pass --preset NAME, or name the dtypes")
    return presets_mod.resolve(names[0], ctx.params.get("tp") or 1).state_dtype


# Completion.


def complete_preset(incomplete: str) -> list[str]:
    from replayssm_cli.model import presets as presets_mod

    word = incomplete.lower()
    return [n for n in presets_mod.preset_names() if n.startswith(word)]


def complete_gpu(incomplete: str) -> list[str]:
    from replayssm_cli.model import gpus

    word = incomplete.lower()
    return [k for k in gpus.gpu_keys() if k.startswith(word)]


def _complete_from(names: Iterable[str]) -> Callable[[str], list[str]]:
    names = tuple(names)
    return lambda incomplete: [n for n in names if n.startswith(incomplete.lower())]


# The options.


def preset(help: str = "Model preset name or preset file; repeat for several.", show_default: Any = False) -> Any:
    return typer.Option("--preset", "-p", help=help, show_default=show_default, callback=_guard(_preset_cb),
                        autocompletion=complete_preset, is_eager=True)


def preset_file(help: str = "A model we don't ship: our preset TOML, a Hugging Face config.json, or the model directory holding it; repeatable.") -> Any:
    return typer.Option("--preset-file", help=help, show_default=False, callback=_guard(_preset_file_cb), is_eager=True)


def batch(help: str = "Batch sizes, comma-separated or repeated.", show_default: Any = False) -> Any:
    return typer.Option("--batch", "-b", help=f"{help} (1 to {MAX_BATCH:,})", show_default=show_default, callback=_ints_cb(1, MAX_BATCH))


def window(help: str = "ReplaySSM window W.", show_default: Any = True, short: bool = True) -> Any:
    names = ("--window", "-w") if short else ("--window",)
    return typer.Option(*names, help=f"{help} (1 to {MAX_WINDOW})", show_default=show_default, callback=_ints_cb(1, MAX_WINDOW))


def draft(help: str = "Speculative widths T: adds verify rows.", lo: int = 1, show_default: Any = False) -> Any:
    return typer.Option("--draft", help=f"{help} ({lo} to {MAX_DRAFT})", show_default=show_default, callback=_ints_cb(lo, MAX_DRAFT))


def context(help: str = "Tokens already in the KV cache, comma-separated or repeated.", show_default: Any = False) -> Any:
    return typer.Option("--context", "-c", help=help, show_default=show_default, callback=_ints_cb(1, 1 << 24))


def accept_rate(help: str = "Probability that each draft is accepted (the first rejection ends the run).") -> Any:
    # 0 is in range; a command refuses a rate that accepts no draft at all in its own words.
    return typer.Option("--accept-rate", help=f"{help} In [0, 1].", callback=_float_cb(0.0, 1.0))


def accept_dist(help: str = "Weights of accepting 0..T drafts, comma-separated (one --draft only).") -> Any:
    return typer.Option("--accept-dist", help=help, callback=_guard(lambda ctx, param, value: ",".join(f"{w:g}" for w in accept_weights(value, _name(param)))))


def tp(help: str = "Tensor-parallel degree the heads are divided by.") -> Any:
    return typer.Option("--tp", "--tensor-parallel-size", help=f"{help} (1 to {MAX_TP})", callback=_ints_cb(1, MAX_TP), is_eager=True)


def gpu(help: str, show_default: Any = False, metavar: str | None = None) -> Any:
    return typer.Option("--gpu", help=help, show_default=show_default, metavar=metavar, callback=_guard(_nonempty_text), autocompletion=complete_gpu)


def _dtype_help(help: str, allowed: tuple[str, ...], auto: str | None, none: bool) -> str:
    extra = (", auto" if auto else "") + (", none" if none else "")
    return f"{help} {', '.join(allowed)}{extra}; the engines' names (float32, bfloat16, ...) work too."


def state_dtype(help: str = "State (checkpoint) dtype:", *, auto: str = "default", show_default: Any = False) -> Any:
    allowed = tuple(d.value for d in dtypes.StateDtype)
    return typer.Option("--state-dtype", help=_dtype_help(help, allowed, auto, False), show_default=show_default, metavar="DTYPE",
                        callback=_dtype_cb(allowed, dtypes.StateDtype, auto=auto), autocompletion=_complete_from((*allowed, "auto")))


def read_dtype(help: str = "Read-copy dtype of split precision:", *, none: bool = False, show_default: Any = False) -> Any:
    allowed = tuple(d.value for d in dtypes.ReadDtype)
    return typer.Option("--read-dtype", help=_dtype_help(help, allowed, None, none), show_default=show_default, metavar="DTYPE",
                        callback=_dtype_cb(allowed, dtypes.ReadDtype, auto=None, none=none), autocompletion=_complete_from(allowed))


def stochastic_rounding(help: str = "Round every stored 16-bit or 8-bit state stochastically (a per-slot Philox stream, "
                        "seeded per slot and step) instead of to nearest; an fp32 state is stored exactly.") -> Any:
    return typer.Option("--stochastic-rounding", help=help)


def refuse_precision(state_dtype: str, read_dtype: str | None = None, rounding: str | None = None) -> None:
    """One line (exit 2) where a state dtype, read copy and rounding cannot go together."""
    why = dtypes.precision_problem(state_dtype, read_dtype, rounding)
    if why:
        hint = "drop --stochastic-rounding, or pass --state-dtype bf16, fp16, fp8 or int8" if "stochastic" in why else \
            "pass a narrower --read-dtype, or none"
        raise UserError(why, hint)


def io_dtype(help: str = "Dtype of inputs and outputs:", show_default: Any = True) -> Any:
    allowed = tuple(d.value for d in dtypes.IODtype)
    return typer.Option("--io-dtype", help=_dtype_help(help, allowed, None, False), show_default=show_default, metavar="DTYPE",
                        callback=_dtype_cb(allowed, dtypes.IODtype, auto=None), autocompletion=_complete_from(allowed))


def dtype(name: str, enum: type, help: str, show_default: Any = True) -> Any:
    """One dtype among an Enum's members, spelled ours or the engines' way (bfloat16, fp8_e4m3, ...)."""
    allowed = tuple(m.value for m in enum)
    return typer.Option(name, help=_dtype_help(help, allowed, None, False), show_default=show_default, metavar="DTYPE",
                        callback=_dtype_cb(allowed, enum, auto=None), autocompletion=_complete_from(allowed))


def words(name: str, help: str, choices: Iterable[str] | None = None, show_default: Any = False,
          complete: Callable[[str], list[str]] | None = None) -> Any:
    """A comma-separated or repeated list of words (variants, baselines), no empty item, from `choices` if given."""
    allowed = tuple(choices) if choices is not None else None
    return typer.Option(name, help=help, show_default=show_default, callback=_words_cb(allowed),
                        autocompletion=complete or (_complete_from(allowed) if allowed else None))


def count(name: str, help: str, lo: int, hi: int, show_default: Any = True, **kw: Any) -> Any:
    """One integer in [lo, hi]."""
    return typer.Option(name, help=f"{help} ({lo} to {hi:,})", show_default=show_default, callback=_ints_cb(lo, hi), **kw)


def number(name: str, help: str, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False, show_default: Any = True) -> Any:
    """One finite number in [lo, hi] (open at an end if asked)."""
    return typer.Option(name, help=help, show_default=show_default, callback=_float_cb(lo, hi, lo_open=lo_open, hi_open=hi_open))


def out(help: str, *names: str, show_default: Any = False, metavar: str | None = None) -> Any:
    """A path to write: not empty, not '-', not a directory, every part of its name within the OS's limit."""
    return typer.Option(*(names or ("--out", "-o")), help=help, show_default=show_default, metavar=metavar, callback=_guard(_out_cb))


def input_file(name: str, help: str, what: str, *short: str) -> Any:
    """A path to read: a regular readable file (a directory, FIFO or symlink loop is named as such)."""
    return typer.Option(name, *short, help=help, show_default=False, callback=_input_path_cb(what))


def input_files_argument(help: str, what: str, **kw: Any) -> Any:
    return typer.Argument(help=help, callback=_input_path_cb(what), **kw)


# Options that need another, and options that exclude each other, by parameter name: checked after parsing.
NEEDS = {
    "accept_rate": ("draft", "--accept-rate needs --draft (the speculative widths whose acceptance it gives)"),
    "accept_dist": ("draft", "--accept-dist needs --draft (the speculative width whose acceptance it gives)"),
    "measured_only": ("results", "--measured-only needs --results (the file whose measurements to keep to)"),
}
EXCLUDES = (
    ("predict", "require_gpu", "--predict and --require-gpu contradict each other; give one"),
    ("accept_rate", "accept_dist", "--accept-rate and --accept-dist both give the acceptance; give one"),
    ("accepted", "accept_rate", "--accepted and --accept-rate both give the acceptance; give one"),
    ("accepted", "accept_dist", "--accepted and --accept-dist both give the acceptance; give one"),
    ("dry_run", "out", "--dry-run writes nothing, so --out has nothing to write; drop one"),
)


class OneValueCommand(TyperCommand):
    """A command that refuses a single-valued option given twice (never "the last wins"), an option without
    the one it needs, and options that contradict each other."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            self._refuse_raw(ctx, list(args))
        rest = super().parse_args(ctx, args)
        if not ctx.resilient_parsing:
            self._refuse_conflicts(ctx)
        return rest

    def _refuse_raw(self, ctx: Any, args: list[str]) -> None:
        """Empty values and repeated single-valued options, seen in the arguments before any conversion
        (a Path option turns '' into '.')."""
        try:
            opts, _, order = self.make_parser(ctx).parse_args(args=args)
        except Exception:
            # Malformed arguments: the real parse below says what is wrong with them.
            return
        params = {p.name: p for p in self.get_params(ctx)}
        for name, value in opts.items():
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, str) and not v.strip() for v in values) and name in params:
                p = params[name]
                label = _name(p) if p.param_type_name == "option" else (p.metavar or name.upper())
                leave = " or leave the option out" if p.param_type_name == "option" else ""
                raise _UsageError(f"{label} is empty; give a value{leave}", ctx)
        seen: set[str] = set()
        for param in order:
            if getattr(param, "multiple", False) or getattr(param, "count", False) or getattr(param, "param_type_name", "") != "option":
                continue
            if param.name in seen:
                names = "/".join(o for o in (*param.opts, *param.secondary_opts))
                takes = "" if param.is_flag else " (it takes one value; the last does not win)"
                raise _UsageError(f"{names} was given more than once; give it once{takes}", ctx)
            seen.add(param.name)

    def _refuse_conflicts(self, ctx: Any) -> None:
        given = {name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}
        for name, (needed, message) in NEEDS.items():
            if name in given and needed in ctx.params and not ctx.params.get(needed):
                raise _UsageError(message, ctx)
        for a, b, message in EXCLUDES:
            if a in given and b in given and ctx.params.get(a) not in (None, False, []) and ctx.params.get(b) not in (None, False, []):
                raise _UsageError(message, ctx)
