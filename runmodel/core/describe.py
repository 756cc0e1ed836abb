"""``engine.describe()``: the resolved phase and hook table, as text."""

from __future__ import annotations

import os

from .hooks import Hook
from .phases import PHASES

__all__ = ["describe_table", "short_path"]


def describe_table(
    hooks: dict[str, list[Hook]], overrides: dict[str, list[Hook]], packs: dict[int, str]
) -> str:
    """One row per override, action and hook, phase by phase in firing order; empty
    phases say so. Overrides are numbered o1 (outermost), o2...; hooks 1, 2..."""
    rows: list[tuple[str, ...]] = [("phase", "#", "hook", "priority", "filter", "pack", "source")]
    for phase, spec in PHASES.items():
        phase_overrides, phase_hooks = overrides.get(phase, ()), hooks[phase]
        for n, h in enumerate(phase_overrides, 1):
            rows.append(_row(phase, f"o{n}", f"override {h.name}", h, packs))
        if spec.has_action:
            rows.append(
                (
                    phase,
                    "-",
                    "action" + (" (wrapped)" if phase_overrides else ""),
                    "",
                    "",
                    "",
                    "built-in",
                )
            )
        elif not phase_hooks:
            rows.append((phase, "-", "(no hooks)", "", "", "", ""))
        rows.extend(_row(phase, str(n), h.name, h, packs) for n, h in enumerate(phase_hooks, 1))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _row(
    phase: str, position: str, label: str, hook: Hook, packs: dict[int, str]
) -> tuple[str, ...]:
    return (
        phase,
        position,
        label,
        f"{hook.options.priority:g}",
        hook.options.filter_text(),
        packs.get(id(hook.pack), "-"),
        short_path(hook.source),
    )


def short_path(source: str) -> str:
    try:
        rel = os.path.relpath(source)
    except ValueError:
        return source
    return source if rel.startswith("..") else rel
