"""The metric names a run's packs and hooks declare, compared at setup.

Packs declare the keys of ``state.metrics`` they read and write (``Pack.reads`` and
``Pack.writes``), hooks with ``reads=``/``writes=``, and the step its own (``loss``, and
what the mode's plan puts there). A name read that nothing declares but that is a typo
away from one declared (``eval_acuracy``), or that cuts its last word short (``eval_acc``
for ``eval_accuracy``), stops the run before its first step whatever else runs, and so
does any other name nothing declares when every hook of the run declares what it writes
(``Checkpoint(best=("eval_accuracy", "max"))`` with no Evaluate attached; ``writes=()``
declares that a hook writes none). A hook of the user's may write metrics without
declaring them: where one runs, a name far from every declared one is left to its
reader, which says so at its first check.

The ``test_`` prefix is reserved: ``test_*`` metrics are a test split's, measured once
after training (``packs/final_evaluation.py``), and a pack or hook that declares reading or
writing one stops the run at setup. What chooses among models (best-K, early stopping,
a sweep) must never see the test set, or it would no longer measure them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .options import metric_names

if TYPE_CHECKING:
    from .hooks import Hook
    from .pack import Pack
    from .table import HookTable

__all__ = [
    "STEP_WRITES",
    "TEST_PREFIX",
    "check_metric_names",
    "check_not_test",
    "closest_name",
    "declared_reads",
    "declared_writes",
    "edit_distance",
]

#: The prefix of a test split's metrics: reserved, read and written by no pack or hook.
TEST_PREFIX = "test_"

#: What every run's step declares: ``loss`` (the ``loss`` metric: in a train run the
#: epoch's mean loss, put there at each epoch's end when a hook or pack of the run declares
#: reading it; in eval mode the evaluation's; else the last step's loss, as
#: ``packs/_common.metric_value`` reads it).
STEP_WRITES = ("loss",)


def declared_writes(
    table: HookTable, mode: str, rank: int, step_writes: Iterable[str]
) -> dict[str, str]:
    """The metric names declared written in a run of ``table`` (mode ``mode``, process
    ``rank``), each with who declares it: the step (``step_writes``), then the hooks
    and packs that run in it."""
    return _declarations(table, mode, rank, step_writes)[0]


def declared_reads(table: HookTable, mode: str, rank: int) -> set[str]:
    """The metric names that the hooks and packs of a run of ``table`` (mode ``mode``,
    process ``rank``) declare reading: what a mode computes only when it is read."""
    return {name for _, name in _declarations(table, mode, rank, ())[1]}


def check_metric_names(table: HookTable, mode: str, rank: int, step_writes: Iterable[str]) -> None:
    """Refuse a read metric name that is not one of the names declared written by the
    packs and hooks of this run (mode ``mode``, process ``rank``) and the step: always
    when it is close to one of them (``closest_name``), whatever else runs; else when every
    hook of the user's that runs declares what it writes (``writes=``, ``writes=()`` for
    none)."""
    written, readers, undeclared = _declarations(table, mode, rank, step_writes)
    for who, name in readers:
        check_not_test(name, who, "reads")
        if name in written:
            continue
        close = closest_name(name, written)
        if close is None and undeclared:
            continue  # one of those hooks may write it: its reader says so if none does
        guess = (
            f"Did you mean {close!r} (written by {written[close]})? "
            if close is not None
            else _where_from(name)
        )
        raise ValueError(
            f"{who} reads the metric {name!r}, which nothing in this run writes. {guess}"
            f"Declared: {', '.join(sorted(written))}. If a hook of yours writes {name!r}, "
            f"declare it: engine.on(phase, fn, writes=[{name!r}]), or in a pack, "
            f"writes = [{name!r}]"
        )


def _where_from(name: str) -> str:
    """What usually writes a metric named like ``name``."""
    if not name.startswith("eval_"):
        return ""
    return (
        f"Evaluation metrics come from an Evaluate pack: engine.attach(Evaluate()) "
        f"measures {name!r} from the model's metric {name[len('eval_') :]!r}. "
    )


def check_not_test(name: str, who: str, does: str = "reads") -> None:
    """Refuse a metric name with the reserved ``test_`` prefix, saying why; ``who``
    (``"EarlyStopping"``) ``does`` (reads, writes) it."""
    if not name.startswith(TEST_PREFIX):
        return
    if does == "reads":
        why = (
            f"a test split's metrics are measured once, after training, and nothing that "
            f"chooses during a run (best checkpoints, early stopping, schedules, sweeps) "
            f"may see them: the test set would then no longer measure the model. Read the "
            f"validation metric ({'eval_' + name[len(TEST_PREFIX) :]!r}) instead"
        )
    else:
        why = (
            "the prefix is reserved for the test split (TorchModel.test_data), which the run "
            "folder evaluates once after training; give these metrics another prefix, such "
            "as 'eval_' or 'val_'"
        )
    raise ValueError(
        f"{who} {does} the metric {name!r}: {TEST_PREFIX}* metrics are reserved. "
        f"{why[0].upper()}{why[1:]}"
    )


def _declarations(
    table: HookTable, mode: str, rank: int, step_writes: Iterable[str]
) -> tuple[dict[str, str], list[tuple[str, str]], bool]:
    """(name written -> who declares it, [(who, name read)], whether a hook of the user's
    that declares no writes runs) of a run."""
    written: dict[str, str] = dict.fromkeys(step_writes, "the step")
    readers: list[tuple[str, str]] = []  # (who, name)
    undeclared = False
    running: set[int] = set()  # the packs with a hook that runs in this run
    hooks = [h for phase in (table.hooks, table.overrides) for hs in phase.values() for h in hs]
    for h in hooks:
        if not _applies(h, mode, rank):
            continue
        who = f"hook {h.name!r}"
        running.add(id(h.pack))
        readers += [(who, n) for n in h.options.reads]
        writes = h.options.writes
        if writes is None:
            undeclared = undeclared or h.pack is None  # a pack's hooks: its writes count
            continue
        for n in writes:
            check_not_test(n, who, "writes")
        written.update((n, written.get(n, who)) for n in writes)
    for key, pack in table.packs.items():
        if id(pack) not in running and any(h.pack is pack for h in hooks):
            continue  # none of its hooks runs in this run: its names do not count
        who = _pack_text(key, pack)
        readers += [(who, n) for n in metric_names(pack.reads, f"{who}.reads")]
        writes = metric_names(pack.writes, f"{who}.writes")
        for n in writes:
            check_not_test(n, who, "writes")
        written.update((n, written.get(n, who)) for n in writes)
    return written, readers, undeclared


def _applies(hook: Hook, mode: str, rank: int) -> bool:
    o = hook.options
    return (o.modes is None or mode in o.modes) and (o.rank is None or rank in o.rank)


def _pack_text(key: str, pack: Pack) -> str:
    kind = type(pack).__name__
    return kind if key in (kind, pack.name) else f"{kind} {key!r}"


def closest_name(name: str, names: Iterable[str]) -> str | None:
    """The declared name ``name`` was meant to be: the nearest within a small edit
    distance (1 for names of up to 7 characters, 2 for longer ones), else the one whose
    last word it cuts short (``eval_acc`` for ``eval_accuracy``)."""
    names = list(names)
    limit = 1 if len(name) < 8 else 2
    best = min(((edit_distance(name, n), n) for n in names), default=None)
    if best is not None and best[0] <= limit:
        return best[1]
    return next((n for n in sorted(names) if _shortened(name, n)), None)


def _shortened(short: str, long: str) -> bool:
    """Whether ``short`` is ``long`` with its last ``_`` word cut short (``eval_acc``,
    ``eval_accuracy``): the same words before it, and at least one letter of it."""
    head, _, word = short.rpartition("_")
    long_head, _, long_word = long.rpartition("_")
    return head == long_head and bool(word) and long_word.startswith(word) and word != long_word


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of neighbours that make ``a`` into
    ``b`` (optimal string alignment distance)."""
    previous2: list[Any] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]
