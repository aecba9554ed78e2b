"""crewAI LLM-call and tool-call hooks that put the governor in the loop.

What each hook does and why it lives there (crewAI 1.15 semantics, see INTEGRATION.md):

* before_llm_call -- prunes ``context.messages`` *in place* (and counts a model step for
  an LLM the governor does not run; a governed LLM's call charges the budgets itself).
  That list object is what the LLM receives; rebinding ``context.messages`` is ignored
  by crewAI. The pruned list also replaces the executor's history, which is what a
  cache-aware pruner expects (its edits move in batches, so the prefix stays
  byte-identical between batches).
* after_llm_call -- runs only on text answers (crewAI skips it for tool-call payloads);
  emits a ``response`` event. (Usage is counted per call by the governed LLM, tool-call
  replies included; this hook only backs up an LLM the governor does not run.)
* before_tool_call -- refuses a call whose tool breaker is open, before crewAI emits its
  tool events or touches its cache; crewAI only lets a hook block with a fixed
  "Tool execution blocked by hook" text, so the structured error is parked and
* after_tool_call -- swaps that text for the governor's JSON and records the refusal as
  a crewAI ToolFailure (crewAI records none for a blocked call).
* execution_start / execution_end -- swap each agent's LLM for its governed copy
  ([`crewai_governor.llm.govern_llm`][crewai_governor.llm.govern_llm]) for the kickoff, and put the originals back
  after; and open a governor task per crew or flow kickoff (unless one is open
  already), because known-bad calls, the retry budget, the step
  budget and the repeated-error guard are per governor task; without one every call is
  its own task and a 404 could be called again and again. A standalone
  ``Agent.kickoff`` runs as a flow (crewAI's ``AgentExecutor``: ``crew=None``,
  ``flow=<executor>``), so it gets a task too. crewAI dispatches execution_end on the
  failure path too, in the same context as execution_start, so the scope always closes.

Every hook first checks `GovernorHooks.active`, which
[`Installation.uninstall`][crewai_governor.hooks.Installation.uninstall]
clears: crewAI copies the global LLM hooks into each executor it builds, so an executor
created while the hooks were installed would keep calling them after ``uninstall()``.

Hooks run on crewAI worker threads (parallel native tool calls use a thread pool), so
shared state here is behind locks. Exceptions other than ``HookAborted`` raised in a hook
are swallowed by crewAI, so a fatal governor error (e.g. a step budget) is re-raised as
a ``HookAborted`` stop ([`crewai_governor.failures.stop_error`][crewai_governor.failures.stop_error]).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from crewai.hooks.dispatch import (
    HookAborted,
    HookFn,
    InterceptionPoint,
    get_global_hook_list,
    get_scoped_hooks,
    register,
    register_scoped,
    scoped_hooks,
    unregister,
)
from crewai.llms.base_llm import BaseLLM
from crewai.tools.tool_failure import ToolExecutionFailedError, failure_from_exception, handle_tool_failure
from crewai.utilities.string_utils import sanitize_tool_name

import loop_governor as lg
from crewai_governor.failures import GovernedToolError, ensure_fatal_relay, stop_error
from crewai_governor.llm import govern_llm, is_governed_llm
from crewai_governor.tools import GovernedTool
from loop_governor.adapter import (
    NAME_CHARS,
    MessagePruner,
    PrunerPool,
    RunAbandoned,
    approx_tokens,
    check_pruner,
    keep_listed,
    links,
    readable_name,
    resolve_governor,
)

__all__ = ["GovernorHooks", "Installation", "MessagePruner", "install", "installed"]

BLOCKED_PREFIX = "Tool execution blocked by hook"
_MAX_RESPONSE_CHARS = 2000


def _count_tokens(messages: list[Any]) -> int:
    return sum(approx_tokens(m) for m in messages)


def _pairs_intact(before: list[Any], after: list[Any]) -> bool:
    """True when ``after`` orphans no tool result and drops no answer to a kept call.

    ReAct conversations carry no tool-call ids and always pass.
    """
    _, answered_before = links(before)
    calls, results = links(after)
    issued = set(calls)
    if any(r is None or r not in issued for r in results):
        return False
    answered = set(results)
    was_answered = set(answered_before)
    return all(c in answered for c in calls if c in was_answered)


def _untally_poll(context: Any) -> None:
    """crewAI 1.15 ends a run on the 5th identical (tool, arguments, result) -- its
    ``check_repeated_tool_call``, counted in the executor's ``_tool_call_counts`` right
    after these hooks. A tool the user declared a poll (``ToolPolicy(poll=True)``), or one that
    only lets time pass (``wait``, ``sleep``), answers alike by design and the governor bounds
    it (a poll's ``max_calls`` and ``max_wall_s``, the task's model calls), so its call is
    taken out of that tally. The key is crewAI's own (see that function); nothing else
    exposes the tally, hence the private attribute, read defensively."""
    agent = getattr(context, "agent", None)
    executor = getattr(agent, "agent_executor", None)
    counts = getattr(executor, "_tool_call_counts", None)
    if not isinstance(counts, dict):
        return
    try:
        key = hash(
            json.dumps([context.tool_name, context.tool_input, str(context.tool_result)], sort_keys=True, default=str)
        )
    except Exception:  # an argument crewAI could not have hashed either
        return
    counts.pop(key, None)


def installed(governor: lg.Governor) -> bool:
    """Whether an active `install` of ``governor`` reaches the current context: its
    hooks registered process-wide, or in the crewAI hook scope this code runs in."""
    point = InterceptionPoint.PRE_MODEL_CALL
    for hook in (*get_scoped_hooks(point), *get_global_hook_list(point)):
        owner = getattr(hook, "__self__", None)
        if isinstance(owner, GovernorHooks) and owner.governor is governor and owner.active:
            return True
    return False


# What crewAI's text (ReAct) prompt lists of the tools: each tool's formatted description
# (render_text_description_and_args), and their names as "[a, b, c]" in the format lines.
_NAMES = re.compile(r"\[([^\[\]\n]*)\]")


def _tools_of(context: Any, governor: lg.Governor) -> list[GovernedTool]:
    """The governed tools (of ``governor``) the agent of an LLM call holds."""
    holder = getattr(context, "executor", None)
    tools = getattr(holder, "tools", None) or getattr(getattr(context, "agent", None), "tools", None) or ()
    found: list[GovernedTool] = []
    for tool in tools:
        original = getattr(tool, "_original_tool", tool)
        if isinstance(original, GovernedTool) and original.governor is governor:
            found.append(original)
    return found


def _without_tools(text: str, gone: list[GovernedTool], names: list[str]) -> tuple[str, list[str]]:
    """``text`` with the ``gone`` tools' descriptions and names taken out of the tool
    listing; and the names of those it found no description of (left listed)."""
    left: list[str] = []
    for tool in gone:
        block = tool.formatted_description
        if block and block in text:
            text = text.replace("\n" + block, "").replace(block + "\n", "").replace(block, "")
        elif tool.name in text:
            left.append(tool.name)
    dropped = {sanitize_tool_name(t.name) for t in gone} - {sanitize_tool_name(n) for n in left}

    def rename(match: re.Match[str]) -> str:
        listed = [n.strip() for n in match.group(1).split(",")]
        if not dropped.intersection(listed) or not set(listed) <= set(names):
            return match.group(0)  # not the tool names list
        return "[" + ", ".join(n for n in listed if n not in dropped) + "]"

    return _NAMES.sub(rename, text), left


def _let_repeat_through(context: Any) -> None:
    """crewAI's text (ReAct) path answers a call identical to the agent's last one with
    "I tried reusing the same input..." without running it, and ends the run itself at the
    5th identical (tool, arguments, result). The governor never saw those calls, so its
    ladder (told at the 3rd, withdrawn at the 4th, then the stop, with partial results)
    never came first. A governed tool's repeats reach the governor instead: crewAI's
    record of the last tool used (a public ToolsHandler attribute, which only that check
    reads) is cleared for them. (A crew that opted into crewAI's cache, `Crew(cache=True)`,
    keeps it: cached answers never reach a tool.)"""
    agent = getattr(context, "agent", None)
    for holder in (
        getattr(agent, "tools_handler", None),
        getattr(getattr(agent, "agent_executor", None), "tools_handler", None),
    ):
        if holder is not None and getattr(holder, "last_used_tool", None) is not None:
            with contextlib.suppress(Exception):
                holder.last_used_tool = None


class GovernorHooks:
    """The four hook callables for one governor; register them with [`install`][crewai_governor.hooks.install].

    ``pruner`` is shared by every conversation (fine for a stateless pruner or a crew
    with one agent); ``pruner_factory`` builds one pruner per agent executor, which is
    what a stateful, cache-aware pruner needs when several agents or tasks run.
    """

    def __init__(
        self,
        governor: lg.Governor,
        *,
        pruner: MessagePruner | None = None,
        pruner_factory: Callable[[], MessagePruner] | None = None,
        block_open_breakers: bool = True,
        govern_llms: bool = True,
        fallback_llms: Sequence[Any] = (),
    ) -> None:
        check_pruner(pruner, pruner_factory)
        self.governor = governor
        # one pruner (and one lock, since a pruner is stateful) per executor / conversation
        self._pruners = PrunerPool(pruner, pruner_factory, weak=True)
        self._block_open_breakers = block_open_breakers
        self._govern_llms = govern_llms
        self._fallback_llms = tuple(fallback_llms)
        # Cleared by Installation.uninstall(); crewAI keeps calling the LLM hooks it copied
        # into executors built while installed, so each hook checks this first.
        self.active = True
        self._lock = threading.Lock()
        # per executor: id(pruned message) -> (pruned message, the original it replaced)
        self._swaps: weakref.WeakKeyDictionary[Any, dict[int, tuple[Any, Any]]] = weakref.WeakKeyDictionary()
        # per executor: id(edited prompt message) -> (original, withdrawn tools, edited), the
        # text prompts with withdrawn tools taken out (_hide_withdrawn)
        self._edits: weakref.WeakKeyDictionary[Any, dict[int, tuple[Any, tuple[str, ...], Any]]] = (
            weakref.WeakKeyDictionary()
        )
        # structured errors for calls blocked in before_tool_call, keyed by the identity of
        # the tool_input dict (the same object reaches the after hook on every path)
        self._blocked: dict[int, tuple[dict[str, Any], lg.CircuitOpenError]] = {}
        # governor task scopes this object opened, per crew / flow kickoff in flight
        self._run_scopes: dict[int, tuple[Any, lg.TaskScope]] = {}
        # per kickoff in flight: (holder, attribute, the LLM it had) swapped for governed copies
        self._swapped: dict[int, list[tuple[Any, str, Any]]] = {}
        # cumulative (prompt, completion, cached) tokens last seen per LLM object
        self._usage_seen: dict[int, tuple[int, int, int]] = {}

    # -- LLM calls --------------------------------------------------------------------
    def before_llm_call(self, context: Any) -> None:
        if not self.active:
            return
        if not is_governed_llm(getattr(context, "llm", None)):
            try:  # a governed LLM charges its call itself; any other is counted here
                self.governor.count_step("model")
            except lg.FatalError as exc:
                raise stop_error(exc) from exc
        self._hide_withdrawn(context)
        owner = getattr(context, "executor", None)
        # a direct LLM call has no executor: no conversation to keep state for
        entry = self._pruners.pruner_for(owner)
        if entry is None:
            return
        pruner, lock = entry
        messages = context.messages
        with lock:
            # crewAI keeps the pruned list as its history; hand the pruner the originals
            # back, so it sees an unchanged prefix and only ingests the new messages.
            before = self._originals(owner, messages)
            try:
                pruned = pruner.prune(before)
            except Exception as exc:  # crewAI would swallow it silently: say so, send unpruned
                self.governor.emit("pruning_failed", error=lg.redact(repr(exc))[:500])
                return
        if len(pruned) == len(messages) and all(a is b for a, b in zip(pruned, messages, strict=True)):
            return  # what crewAI holds already is what the model should see
        if not _pairs_intact(before, pruned):
            # A provider rejects a tool result without its call (and vice versa): sending
            # the unpruned list is always safe, sending a broken one fails the run.
            self.governor.emit(
                "pruning_rejected",
                reason="orphaned tool call or result",
                messages_before=len(before),
                messages_after=len(pruned),
            )
            return
        messages[:] = pruned  # in place: crewAI sends this very list object
        self._remember_swaps(owner, before, pruned)
        self.governor.emit(
            "pruning",
            tokens_before=_count_tokens(before),
            tokens_after=_count_tokens(pruned),
            messages_before=len(before),
            messages_after=len(pruned),
        )

    def _hide_withdrawn(self, context: Any) -> None:
        """crewAI's text (ReAct) path lists the tools in the prompt: take the withdrawn ones
        out of that text (and put them back once they are offered again). The edited
        messages are copies, made once per withdrawal set and reused, so the prompt stays
        byte-identical between withdrawals. A withdrawn tool whose description the prompt
        does not hold as crewAI renders it stays listed: the ladder then refuses its calls
        instead of ending the run (`loop_governor.policies.ladder.keep_listed`)."""
        llm = getattr(context, "llm", None)
        owner = getattr(context, "executor", None)
        scope = self.governor.current_task()
        if scope is None or owner is None or getattr(llm, "supports_function_calling", lambda: True)():
            return
        edits = self._edits.get(owner)
        if not scope.withdrawn and not edits:
            return
        tools = _tools_of(context, self.governor)
        gone = [t for t in tools if t.name in scope.withdrawn]
        key = tuple(sorted(t.name for t in gone))
        names = [sanitize_tool_name(t.name) for t in tools]
        messages = context.messages
        edits = edits if edits is not None else {}
        for i, message in enumerate(messages):
            known = edits.get(id(message))
            original = known[0] if known is not None and known[2] is message else message
            if not isinstance(original, dict) or original.get("role") not in ("system", "user"):
                continue
            content = original.get("content")
            if not isinstance(content, str):
                continue
            if known is not None and known[2] is message and known[1] == key:
                continue  # already as this withdrawal set wants it
            text, left = _without_tools(content, gone, names) if gone else (content, [])
            keep_listed(scope, left)
            edited = original if text == content else {**original, "content": text}
            messages[i] = edited
            edits.pop(id(message), None)
            if edited is not original:
                edits[id(edited)] = (original, key, edited)
        with self._lock:
            self._edits[owner] = edits

    def _originals(self, owner: Any, messages: list[Any]) -> list[Any]:
        """``messages`` with every message this hook pruned earlier swapped back for its original."""
        swaps = self._swaps.get(owner) if owner is not None else None
        if not swaps:
            return list(messages)
        out = []
        for m in messages:
            swap = swaps.get(id(m))
            out.append(swap[1] if swap is not None and swap[0] is m else m)
        return out

    def _remember_swaps(self, owner: Any, originals: list[Any], pruned: list[Any]) -> None:
        if owner is None:
            return
        if len(originals) != len(pruned):
            self._swaps.pop(owner, None)  # not aligned: the pruner will rebuild, still correct
            return
        # Keep both objects alive: the key is the pruned object's id.
        swaps = {id(p): (p, o) for p, o in zip(pruned, originals, strict=True) if p is not o}
        with self._lock:
            self._swaps[owner] = swaps

    def after_llm_call(self, context: Any) -> None:
        if not self.active:
            return
        llm = getattr(context, "llm", None)
        if not is_governed_llm(llm):
            self._record_usage(llm)
        response = getattr(context, "response", None)
        if not isinstance(response, str):
            return
        agent = getattr(context, "agent", None)
        self.governor.emit(
            "response",
            text=lg.redact(response)[:_MAX_RESPONSE_CHARS],
            agent_role=getattr(agent, "role", None),
            iterations=getattr(context, "iterations", None),
        )

    def _record_usage(self, llm: Any) -> None:
        """Feed the task's token / cost budgets from the LLM's cumulative usage (the
        delta since the last call; hooks run in the task's own thread, unlike events)."""
        summary = getattr(llm, "get_token_usage_summary", None)
        if summary is None:
            return
        try:
            usage = summary()
        except Exception:
            return
        now = (
            int(getattr(usage, "prompt_tokens", 0) or 0),
            int(getattr(usage, "completion_tokens", 0) or 0),
            int(getattr(usage, "cached_prompt_tokens", 0) or 0),
        )
        with self._lock:
            before = self._usage_seen.get(id(llm), (0, 0, 0))
            self._usage_seen[id(llm)] = now
        delta = [max(0, a - b) for a, b in zip(now, before, strict=True)]
        if any(delta):
            self.governor.record_usage(getattr(llm, "model", None), delta[0], delta[1], delta[2])

    # -- tool calls -------------------------------------------------------------------
    def before_tool_call(self, context: Any) -> bool | None:
        if not self.active:
            return None
        tool = getattr(context, "tool", None)
        original = getattr(tool, "_original_tool", None)
        governed = original if isinstance(original, GovernedTool) else tool
        if not isinstance(governed, GovernedTool) or governed.governor is not self.governor:
            return None
        _let_repeat_through(context)
        if not self._block_open_breakers:
            return None
        try:
            self.governor.check_breaker(governed.name)
        except lg.CircuitOpenError as refusal:
            tool_input = context.tool_input
            self.governor.emit_tool_error(
                governed.name, refusal.info, call_key=None, circuit_open=True, blocked_by_hook=True
            )
            with self._lock:
                self._blocked[id(tool_input)] = (tool_input, refusal)
            return False  # crewAI: "blocked"; after_tool_call puts the structured error in
        return None

    def after_tool_call(self, context: Any) -> str | None:
        if not self.active:
            return None
        policy = self.governor.rt.policy("tool", str(getattr(context, "tool_name", "")))
        if policy.poll or policy.wait:
            _untally_poll(context)
        if not self._blocked:
            return None
        with self._lock:
            entry = self._blocked.pop(id(context.tool_input), None)
        if entry is None or entry[0] is not context.tool_input:
            return None
        result = context.tool_result
        if not (isinstance(result, str) and result.startswith(BLOCKED_PREFIX)):
            return None
        refusal = entry[1]
        # crewAI records no failure for a blocked call; record it as the governed tool
        # would have (raised: reason "exception"), so TaskOutput.tool_failures and the
        # failure policy see every refusal.
        try:
            handle_tool_failure(
                failure_from_exception(GovernedToolError(refusal)),
                tool_name=context.tool_name,
                tool_args=context.tool_input,
                tool=context.tool,
                agent=context.agent,
                task=context.task,
                crew=context.crew,
            )
        except ToolExecutionFailedError as exc:
            # policy RAISE; only HookAborted gets through crewAI's hook dispatcher
            raise HookAborted(str(exc), source="loop_governor") from exc
        return refusal.info.to_model_text()

    # -- crew / flow kickoff boundaries ---------------------------------------------------
    @staticmethod
    def _run_of(context: Any) -> tuple[Any, str] | None:
        """The crew or flow whose kickoff this is (a standalone ``Agent.kickoff`` is a flow)."""
        crew = getattr(context, "crew", None)
        if crew is not None:
            return crew, "crew"
        flow = getattr(context, "flow", None)
        if flow is not None:
            return flow, "flow"
        return None

    def execution_start(self, context: Any) -> None:
        if not self.active:
            return
        run = self._run_of(context)
        if run is None:
            return
        owner, kind = run
        if self._govern_llms:
            self._swap_llms(owner, kind)
        if self.governor.current_task() is not None:
            return
        # A task an earlier kickoff of this crew left open ended first: crewAI dispatches
        # execution_end for a kickoff that raised an Exception, not for one cancelled or
        # interrupted (CancelledError, KeyboardInterrupt).
        self._end_run(owner, RunAbandoned("the kickoff ended before crewAI said so (cancelled or interrupted)"))
        scope = self.governor.task(f"crewai-{kind}-{getattr(owner, 'id', None) or id(owner)}", name=_run_name(owner))
        scope.__enter__()
        with self._lock:
            self._run_scopes[id(owner)] = (owner, scope)
        try:
            running = asyncio.current_task()
        except RuntimeError:  # no event loop: a sync kickoff
            running = None
        if running is not None:  # an async kickoff: its end, however it comes, ends the task
            running.add_done_callback(functools.partial(self._kickoff_done, owner, scope))

    def _swap_llms(self, owner: Any, kind: str) -> None:
        """Give the kickoff's agents (a standalone agent's executor) governed LLM copies."""
        holders = list(getattr(owner, "agents", None) or ()) if kind == "crew" else [owner]
        compact = self._pruners.enabled
        swapped: list[tuple[Any, str, Any]] = []
        if kind == "crew":
            holders.append(owner)  # the crew's own function_calling_llm / manager_llm
        for holder in holders:
            # every model the kickoff calls: the agent's, and the one crewAI parses tool
            # calls with, and a hierarchical crew's manager (crewAI's own retries would
            # multiply the governor's on an ungoverned one)
            for attr in ("llm", "function_calling_llm", "manager_llm"):
                llm = getattr(holder, attr, None)
                if isinstance(llm, BaseLLM) and not is_governed_llm(llm):
                    fallbacks = self._fallback_llms if attr == "llm" else ()
                    governed = govern_llm(llm, self.governor, fallbacks=fallbacks, compact=compact)
                    setattr(holder, attr, governed)
                    swapped.append((holder, attr, llm))
        if swapped:
            with self._lock:
                self._swapped[id(owner)] = swapped

    def _restore_llms(self, owner: Any) -> None:
        with self._lock:
            swapped = self._swapped.pop(id(owner), ())
        for holder, attr, original in swapped:
            setattr(holder, attr, original)

    def execution_end(self, context: Any) -> None:
        # Not gated on ``active``: a scope this object opened is closed whatever happens.
        run = self._run_of(context)
        if run is None:
            return
        owner = run[0]
        self._restore_llms(owner)
        error = getattr(context, "error", None)  # crewAI's, for a kickoff that raised
        self._end_run(owner, error if isinstance(error, BaseException) else None)

    def _end_run(self, owner: Any, error: BaseException | None, scope: lg.TaskScope | None = None) -> bool:
        """End the task this object opened for ``owner``'s kickoff (``scope``: only that
        one), with ``error`` as how the kickoff ended; whether there was one to end."""
        with self._lock:
            entry = self._run_scopes.get(id(owner))
            if entry is None or entry[0] is not owner or (scope is not None and entry[1] is not scope):
                return False
            del self._run_scopes[id(owner)]
        entry[1].__exit__(type(error) if error is not None else None, error, None)
        return True

    def _kickoff_done(self, owner: Any, scope: lg.TaskScope, task: asyncio.Task[Any]) -> None:
        """An async kickoff's task finished: a task crewAI's execution_end did not end
        (the kickoff was cancelled) ends here."""
        error: BaseException = (
            asyncio.CancelledError() if task.cancelled() else RunAbandoned("the kickoff ended before crewAI said how")
        )
        if self._end_run(owner, error, scope):
            self._restore_llms(owner)

    def callables(self) -> dict[InterceptionPoint, HookFn]:
        return {
            InterceptionPoint.EXECUTION_START: self.execution_start,
            InterceptionPoint.EXECUTION_END: self.execution_end,
            InterceptionPoint.PRE_MODEL_CALL: self.before_llm_call,
            InterceptionPoint.POST_MODEL_CALL: self.after_llm_call,
            InterceptionPoint.PRE_TOOL_CALL: self.before_tool_call,
            InterceptionPoint.POST_TOOL_CALL: self.after_tool_call,
        }


def _run_name(owner: Any) -> str | None:
    """What a person calls a kickoff: the crew's name if one was given, else its (first)
    task's description; a flow's (a standalone agent's) name or role."""
    tasks = list(getattr(owner, "tasks", None) or ())
    name = getattr(owner, "name", None)
    if tasks and (not isinstance(name, str) or name in ("", "crew")):  # "crew": crewAI's default
        first = str(getattr(tasks[0], "name", None) or getattr(tasks[0], "description", "") or "").strip()
        more = f" (+{len(tasks) - 1} more tasks)" if len(tasks) > 1 else ""
        return f"{readable_name(first, NAME_CHARS - len(more))}{more}" if first else None
    if isinstance(name, str) and name:
        return name
    role = getattr(owner, "role", None)
    return str(role) if role else None


class Installation:
    """The hooks of one [`install`][crewai_governor.hooks.install] call; a context manager.

    Scoped: hooks are registered on ``__enter__`` into a crewAI hook scope (a contextvar
    that crewAI's worker threads inherit) and vanish on ``__exit__``, so two crews in one
    process can run under different governors. Global: hooks are registered at once and
    removed by [`uninstall`][crewai_governor.hooks.Installation.uninstall] or ``__exit__``.
    """

    def __init__(self, hooks: GovernorHooks, *, scoped: bool, task_id: str | None) -> None:
        self.hooks = hooks
        self.scoped = scoped
        self.task_id = task_id
        self._stack: contextlib.ExitStack | None = None
        self._global = False
        if not scoped:
            for point, fn in hooks.callables().items():
                register(point, fn)
            self._global = True

    def __enter__(self) -> Installation:
        stack = contextlib.ExitStack()
        if self.scoped:
            self.hooks.active = True  # a scoped installation may be entered again
            # Carry over hooks an enclosing scope registered: scoped_hooks() starts empty.
            inherited = {point: get_scoped_hooks(point) for point in InterceptionPoint}
            stack.enter_context(scoped_hooks({p: h for p, h in inherited.items() if h}))
            for point, fn in self.hooks.callables().items():
                register_scoped(point, fn)
        if self.task_id is not None:
            stack.enter_context(self.hooks.governor.task(self.task_id))
        self._stack = stack
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.__exit__(exc_type, exc, tb)
        self.uninstall()

    async def __aenter__(self) -> Installation:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def uninstall(self) -> None:
        """Remove globally registered hooks and switch the hooks off.

        crewAI copies the global LLM hooks into each executor it builds, so an executor
        created while installed would keep calling them: the hooks check
        `GovernorHooks.active`, cleared here. Scoped hooks vanish with their scope.
        """
        self.hooks.active = False
        if self._global:
            for point, fn in self.hooks.callables().items():
                unregister(point, fn)
            self._global = False


def install(
    governor: lg.Governor | None = None,
    *,
    pruner: MessagePruner | None = None,
    pruner_factory: Callable[[], MessagePruner] | None = None,
    scoped: bool = True,
    task_id: str | None = None,
    block_open_breakers: bool = True,
    govern_llms: bool = True,
    fallback_llms: Sequence[Any] = (),
) -> Installation:
    """Register the governor's crewAI hooks.

    ``scoped=True`` (default): use as ``with install(g): crew.kickoff()`` (or around
    ``await crew.akickoff()``); the hooks apply to that run only. ``scoped=False``:
    process-wide until ``.uninstall()``. Each crew or flow kickoff (a standalone
    ``Agent.kickoff`` too) runs in a governor task of its own unless one is open
    already; ``task_id`` opens ``governor.task(task_id)`` for the ``with`` block
    instead, so budgets and known-bad calls span several kickoffs.

    ``govern_llms`` (default): every agent's LLM is swapped for its governed copy for the
    kickoff (see [`crewai_governor.llm.govern_llm`][crewai_governor.llm.govern_llm]), so each model call is governed;
    ``fallback_llms`` answer, in order, while an agent's model is down.
    """
    ensure_fatal_relay()
    hooks = GovernorHooks(
        resolve_governor(governor),
        pruner=pruner,
        pruner_factory=pruner_factory,
        block_open_breakers=block_open_breakers,
        govern_llms=govern_llms,
        fallback_llms=fallback_llms,
    )
    return Installation(hooks, scoped=scoped, task_id=task_id)
