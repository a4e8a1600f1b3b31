"""Chat templates from model files, rendered sandboxed and bounded.

Chat templates come from model files, so they are untrusted code. ``render_chat_template``
runs them in Jinja's immutable sandbox (no internals, no mutation), refuses templates that
load other templates (``include``, ``import``, ``extends``), and bounds every render in
time, in steps (loop iterations and macro calls) and in size (every string it builds or
writes), so a template can neither run for long nor allocate much: each failure, a bound
hit, a Python error inside the template, is a GenerationError with a hint. It is safe to
call from any thread (the server renders on worker threads).
"""

from __future__ import annotations

import contextvars
import functools
import math
import re
import string
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from edgekit.errors import GenerationError

if TYPE_CHECKING:
    from jinja2 import Template

#: A render of a chat template may take this long (a real one takes milliseconds).
TEMPLATE_SECONDS = 1.0
#: ... build strings and write output of at most this many characters in all (about a
#: million tokens: more than any context edgekit runs).
TEMPLATE_MAX_CHARS = 4_000_000
#: ... execute at most this many blocks (loop iterations, macro calls, branches taken).
TEMPLATE_MAX_STEPS = 200_000
#: A template's own source may be this long (real ones are under 20 KB).
TEMPLATE_MAX_SOURCE = 200_000
# An integer a template computes may have this many bits (10 ** 10 ** 8 would take minutes).
_MAX_INT_BITS = 1 << 16

NO_TEMPLATE_HINT = (
    "this model has no chat template, so it cannot be sent chat messages: give it a plain "
    "prompt instead, e.g. edgekit run BUNDLE -p 'Once upon a time' "
    "(in Python: session.generate(prompt))"
)
_HOSTILE_HINT = (
    "the chat template in this model file is broken or hostile: use a model from a source "
    "you trust, or send a plain prompt (edgekit run BUNDLE -p PROMPT)"
)


class _LimitReached(Exception):
    """A chat template went past one of its bounds (internal: becomes GenerationError)."""


class _Budget:
    """What one render may still spend: time, steps and characters."""

    def __init__(self, seconds: float, max_chars: int, max_steps: int) -> None:
        self.seconds = seconds
        self.deadline = time.perf_counter() + seconds
        self.max_chars = max_chars
        self.max_steps = max_steps
        self.chars = 0
        self.steps = 0

    def check_time(self) -> None:
        if time.perf_counter() > self.deadline:
            raise _LimitReached(f"it ran longer than {self.seconds:g} s")

    def step(self, chars: int) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise _LimitReached(f"it ran more than {self.max_steps:,} loop steps")
        self.emit(chars)
        self.check_time()

    def emit(self, chars: int) -> None:
        self.chars += chars
        if self.chars > self.max_chars:
            raise _LimitReached(f"it wrote more than {self.max_chars:,} characters")

    def size(self, chars: int, what: str) -> None:
        """Refuse to build one value of ``chars`` characters (or items)."""
        if chars > self.max_chars:
            raise _LimitReached(f"{what} would make {chars:,} characters")


_BUDGET: contextvars.ContextVar[_Budget] = contextvars.ContextVar("edgekit_template_budget")


def _budget() -> _Budget:
    try:
        return _BUDGET.get()
    except LookupError as exc:  # the environment is only used through render_chat_template
        raise _LimitReached("rendered outside render_chat_template") from exc


def _repeat_size(left: Any, right: Any) -> int | None:
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, str | bytes | list | tuple) and isinstance(times, int):
            return len(seq) * max(times, 0)
    return None


_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_percent(fmt: str, budget: _Budget) -> None:
    """A printf-style format may not pad a field beyond the budget ('%999999999d')."""
    for width, precision in _PERCENT_FIELD.findall(fmt):
        for n in (width, precision):
            if n == "*":
                raise _LimitReached("a '*' width in a % format is not allowed")
            if n:
                budget.size(int(n), "a % format field")


def _check_format_spec(fmt: str, budget: _Budget) -> None:
    """str.format may not pad a field beyond the budget ('{:>999999999}')."""
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if spec and "{" in spec:
            raise _LimitReached("a nested format spec is not allowed")
        for n in re.findall(r"\d+", spec or ""):
            budget.size(int(n), "a format field")


def _check_str_method(
    owner: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], budget: _Budget
) -> tuple[Any, ...]:
    """Size checks for the str methods whose result can be far larger than their input;
    returns the arguments to call with (an iterator given to join is read once, here)."""
    if name in ("ljust", "rjust", "center", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        if isinstance(width, int):
            budget.size(width, f"str.{name}")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            budget.size(len(owner) + owner.count("\t") * size, "str.expandtabs")
    elif name == "join" and args:
        items = list(args[0])
        total = sum(len(x) for x in items if isinstance(x, str))
        budget.size(total + len(owner) * max(len(items) - 1, 0), "str.join")
        args = (items, *args[1:])
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, str) and isinstance(new, str):
            hits = owner.count(old) if old else len(owner) + 1
            if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                hits = min(hits, args[2])
            budget.size(len(owner) + hits * (len(new) - len(old)), "str.replace")
    elif name in ("format", "format_map"):
        _check_format_spec(owner, budget)
    elif name == "translate":
        raise _LimitReached("str.translate is not available in chat templates")
    return args


def _safe_filters() -> dict[str, Any]:
    """The filters whose output can dwarf their input, each with a size check first."""
    from jinja2 import filters, pass_eval_context

    def center(value: Any, width: int = 80) -> str:
        if isinstance(width, int):
            _budget().size(width, "the center filter")
        return str(value).center(width)

    def indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
        text = str(s)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        _budget().size(len(text) + (text.count("\n") + 1) * pad, "the indent filter")
        return filters.do_indent(text, width, first, blank)

    @pass_eval_context
    def join(eval_ctx: Any, value: Iterable[Any], d: str = "", attribute: Any = None) -> str:
        items = list(value)
        if attribute is not None:
            items = list(map(filters.make_attrgetter(eval_ctx.environment, attribute), items))
        parts = [x if isinstance(x, str) else str(x) for x in items]
        _budget().size(sum(map(len, parts)) + len(str(d)) * max(len(parts) - 1, 0), "join")
        return str(d).join(parts)

    @pass_eval_context
    def replace(eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> str:
        text, old, new = str(s), str(old), str(new)
        _check_str_method(
            text, "replace", (old, new, -1 if count is None else count), {}, _budget()
        )
        return text.replace(old, new, -1 if count is None else count)

    def format_(value: Any, *args: Any, **kwargs: Any) -> str:
        _check_percent(str(value), _budget())
        return filters.do_format(value, *args, **kwargs)

    def batch(value: Any, linecount: int, fill_with: Any = None) -> Iterator[list[Any]]:
        if isinstance(linecount, int):
            _budget().size(linecount, "the batch filter")
        return filters.do_batch(value, linecount, fill_with)

    def slice_(value: Any, slices: int, fill_with: Any = None) -> Iterator[list[Any]]:
        if isinstance(slices, int):
            _budget().size(slices, "the slice filter")
        return filters.sync_do_slice(value, slices, fill_with)

    return {
        "center": center,
        "indent": indent,
        "join": join,
        "replace": replace,
        "format": format_,
        "batch": batch,
        "slice": slice_,
    }


def _bounded_code() -> Any:
    """The code generator of chat templates (a class, made once with the environment)."""
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator, Frame

    class BoundedCode(CodeGenerator):
        """Generated template code that pays for what it does: every block it runs (a
        loop iteration, a macro call, a branch) costs a step and its literal text, and
        every ``~`` concatenation is sized before it is built."""

        def blockvisit(self, body: Iterable[nodes.Node], frame: Frame) -> None:
            body = list(body)
            literal = sum(
                len(child.data)
                for node in body
                if isinstance(node, nodes.Output)
                for child in node.nodes
                if isinstance(child, nodes.TemplateData)
            )
            self.writeline(f"environment.edgekit_step({literal})")
            super().blockvisit(body, frame)

        def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
            self.write("environment.edgekit_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    return BoundedCode


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """What a ``*``, ``**``, ``+`` or ``%`` would build, sized before it is built."""
    budget = _budget()
    budget.check_time()
    if operator == "*":
        size = _repeat_size(left, right)
        if size is not None:
            budget.size(size, "a * repetition")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int):
        if abs(left) > 1 and right > 0 and right * math.log2(abs(left)) > _MAX_INT_BITS:
            raise _LimitReached(f"{left} ** {right} is too large a number")
    elif (
        operator == "+"
        and isinstance(left, str | list | tuple)
        and isinstance(right, str | list | tuple)
    ):
        budget.size(len(left) + len(right), "a + concatenation")
    elif operator == "%" and isinstance(left, str):
        _check_percent(left, budget)


@functools.cache
def _environment() -> Any:
    """The one Jinja environment for chat templates (its budget is per render)."""
    from jinja2 import pass_context
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    @pass_context
    def finalize(_context: Any, value: Any) -> str:
        # Every value a template writes passes here, also into {% set %} blocks and
        # macros, so what it writes in all is counted (a buffer doubled in a loop stops).
        text = "" if value is None else str(value)
        _budget().emit(len(text))
        return text

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        code_generator_class = _bounded_code()
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def edgekit_step(self, literal: int) -> str:
            _budget().step(literal)
            return ""

        def edgekit_concat(self, parts: Sequence[Any]) -> str:
            texts = [str(p) for p in parts]
            _budget().size(sum(map(len, texts)), "a ~ concatenation")
            return "".join(texts)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            budget = _budget()
            budget.check_time()
            method = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped
            owner = getattr(method, "__self__", None)
            if isinstance(owner, str):
                args = _check_str_method(owner, method.__name__, args, kwargs, budget)
            return super().call(__context, __obj, *args, **kwargs)

        def getattr(self, obj: Any, attribute: str) -> Any:
            _budget().check_time()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            _budget().check_time()
            return super().getitem(obj, argument)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, optimized=False, finalize=finalize)
    env.filters.update(_safe_filters())
    env.globals.pop("lipsum", None)  # lipsum(n=10**6) writes megabytes; no template uses it
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(str(fmt))
    return env


def _raise_exception(message: Any) -> None:
    raise GenerationError(
        f"the chat template refused the messages: {message}",
        hint="the model's template does not accept these messages (a role it does not know, "
        "or roles out of order): change the messages",
    )


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> Template:
    """The compiled template (compiled once per source; rendering is per call)."""
    from jinja2 import nodes

    if len(source) > TEMPLATE_MAX_SOURCE:
        raise _LimitReached(
            f"its source is {len(source):,} characters (at most {TEMPLATE_MAX_SOURCE:,})"
        )
    env = _environment()
    tree = env.parse(source)
    loads = {
        nodes.Include: "include",
        nodes.Import: "import",
        nodes.FromImport: "from ... import",
        nodes.Extends: "extends",
    }
    for kind, tag in loads.items():
        if next(tree.find_all(kind), None) is not None:
            raise _LimitReached(f"it uses {{% {tag} %}}: a chat template must be self-contained")
    template: Template = env.from_string(tree)
    return template


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    seconds: float = TEMPLATE_SECONDS,
    max_chars: int = TEMPLATE_MAX_CHARS,
    max_steps: int = TEMPLATE_MAX_STEPS,
) -> str:
    """Apply a model's Jinja chat template, sandboxed and bounded (see the module text).

    Returns within about ``seconds`` whatever the template does; safe on any thread.

    Raises:
        GenerationError: the template is invalid, raises (``raise_exception``), fails in
            any other way, or goes past a bound (time, steps, characters).
    """
    budget = _Budget(seconds, max_chars, max_steps)
    token = _BUDGET.set(budget)
    try:
        text = _compile(template).render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
        )
        budget.size(len(text), "the rendered prompt")
        return text
    except GenerationError:
        raise
    except _LimitReached as exc:
        raise GenerationError(
            f"the model's chat template was stopped: {exc}", hint=_HOSTILE_HINT
        ) from exc
    except RecursionError as exc:
        raise GenerationError(
            "the model's chat template recursed too deeply", hint=_HOSTILE_HINT
        ) from exc
    except Exception as exc:  # noqa: BLE001 - anything a template raises is the template's failure
        raise GenerationError(
            f"the model's chat template failed: {type(exc).__name__}: {exc}",
            hint="pass a prompt to generate() instead (edgekit run BUNDLE -p PROMPT), "
            "or fix the template in the model",
        ) from exc
    finally:
        _BUDGET.reset(token)
