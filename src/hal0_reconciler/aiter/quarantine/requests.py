"""The heals a check asks for, the restores the operator asks for, and the roll of interrupted ones.

Every move is made under the digest book's lock with the tree owner's credentials (``io_for``
judges them again each time), and what a heal or restore did is remembered (``heal-memory.json``)
so that the convergence guard can see it next time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from hal0_reconciler import _log
from hal0_reconciler.aiter.decision import plan
from hal0_reconciler.aiter.quarantine import as_owner as owner_heal
from hal0_reconciler.aiter.quarantine import digests as manifest_digest
from hal0_reconciler.aiter.quarantine import heal
from hal0_reconciler.aiter.trees import owner_io as treeio
from hal0_reconciler.settings import Settings

log = _log.get_logger()


@dataclass(frozen=True)
class HealResult:
    """What happened to one JIT folder's heal."""

    jit_dir: PurePath
    modules: tuple[str, ...]
    quarantine: str | None = None
    refused: tuple[str, ...] = ()  # builds in progress: retry later
    error: str | None = None
    still_mapped: dict[str, list[str]] = field(default_factory=dict)


class Healer:
    """Moves modules in and out of quarantine for one monitor; says each refusal once."""

    def __init__(
        self,
        settings: Settings,
        *,
        book: manifest_digest.DigestBook,
        memory_file: Path,
        io_for: Callable[[Path], treeio.TreeIO],
    ) -> None:
        self.settings = settings
        self.book = book
        self.memory_file = memory_file
        self._io_for = io_for
        self._refusals: set[tuple[str, str, str]] = set()  # said once, not once per pass

    def load_memory(self) -> dict[str, plan.MemoryEntry]:
        return heal.load_memory(self.memory_file)

    def recover(self, jit_dir: Path) -> None:
        """Roll each heal or restore a kill interrupted in ``jit_dir`` forward or back."""
        try:
            rolled = owner_heal.recover(self._io_for(jit_dir), jit_dir, book=self.book)
        except (OSError, heal.HealFailed) as exc:
            if (str(jit_dir), "", str(exc)) not in self._refusals:
                self._refusals.add((str(jit_dir), "", str(exc)))
                log.error("aiter.quarantine_roll_failed", jit_dir=str(jit_dir), error=str(exc))  # noqa: TRY400
            return
        for r in rolled:
            fields = {"jit_dir": str(jit_dir), "quarantine": r.quarantine, "op": r.op}
            if r.outcome == "forward":
                log.warning("aiter.interrupted_rolled_forward", **fields, detail=r.detail)
            elif r.outcome == "back":
                log.warning("aiter.interrupted_rolled_back", **fields, detail=r.detail)
            elif r.outcome == "cleared":
                log.info("aiter.interrupted_cleared", **fields, detail=r.detail)
            elif (str(jit_dir), r.quarantine, r.detail) not in self._refusals:
                self._refusals.add((str(jit_dir), r.quarantine, r.detail))
                log.error("aiter.interrupted_left_alone", **fields, reason=r.detail)

    def heal_plans(
        self,
        plans: list[plan.EnvPlan],
        memory: dict[str, plan.MemoryEntry],
        packages: Mapping[PurePath | None, Path],
    ) -> list[HealResult]:
        """Quarantine, per JIT folder, the modules the plans ask to heal (``packages``: the
        folder's package, where a build in progress shows)."""
        return [
            self._heal_folder(Path(jit), mods, packages.get(jit, Path(jit)), memory)
            for jit, mods in plan.heal_set(plans).items()
        ]

    def _heal_folder(
        self,
        jit_dir: Path,
        mods: dict[str, plan.ModulePlan],
        package: Path,
        memory: dict[str, plan.MemoryEntry],
    ) -> HealResult:
        names = tuple(sorted(mods))
        busy = heal.build_activity(jit_dir, package, names)
        if busy:
            log.warning(
                "aiter.heal_refused_build_running",
                jit_dir=str(jit_dir),
                modules=list(names),
                busy=busy,
            )
            return HealResult(jit_dir, names, refused=tuple(busy))
        holders = heal.mapped_by(Path(m.so_path) for m in mods.values())
        try:
            with self.book.locked():
                io = self._io_for(jit_dir)
                q = owner_heal.quarantine(io, jit_dir, mods, book=self.book)
        except (heal.HealFailed, OSError) as exc:
            log.error(  # noqa: TRY400 - the one human line is in `error`
                "aiter.heal_failed", jit_dir=str(jit_dir), modules=list(names), error=str(exc)
            )
            return HealResult(jit_dir, names, error=str(exc))
        for name, mp in sorted(mods.items()):
            memory[str(mp.so_path)] = plan.MemoryEntry(
                mp.digest,
                frozenset(m.name for m in mp.missing),
                "healed",
                q.id,
                q.identities.get(name),
            )
            log.warning(
                "aiter.module_quarantined",
                module=name,
                quarantine=q.id,
                jit_dir=str(jit_dir),
                missing=len(mp.missing),
                sample=sample(mp),
                still_mapped_by=holders.get(str(mp.so_path), []),
                credentials=io.describe(),
            )
        try:
            heal.save_memory(self.memory_file, memory)
        except OSError as exc:
            log.error("aiter.heal_memory_unwritable", error=str(exc))  # noqa: TRY400
        self.prune(jit_dir)
        still_mapped = {k: v for k, v in holders.items() if v}
        return HealResult(jit_dir, names, quarantine=q.id, still_mapped=still_mapped)

    def prune(self, jit_dir: Path) -> None:
        """Remove the quarantines beyond ``keep_quarantines`` in ``jit_dir``."""
        try:
            with self.book.locked():
                keep = self.settings.aiter.keep_quarantines
                pruned = owner_heal.prune(self._io_for(jit_dir), jit_dir, keep=keep, book=self.book)
        except (OSError, heal.HealFailed) as exc:
            log.error("aiter.quarantine_prune_failed", jit_dir=str(jit_dir), error=str(exc))  # noqa: TRY400
            return
        if pruned.removed:
            log.info(
                "aiter.quarantine_pruned", jit_dir=str(jit_dir), quarantines=list(pruned.removed)
            )
        for qid, why in pruned.kept:
            log.warning("aiter.quarantine_kept", jit_dir=str(jit_dir), quarantine=qid, reason=why)

    def restore(
        self, qid: str, jits: list[Path]
    ) -> tuple[Path, heal.Quarantine, heal.Quarantine | None]:
        """Put quarantine ``qid`` back in whichever of ``jits`` holds it: that folder, the
        quarantine restored and the one it displaced. Raises HealFailed."""
        holder = next((j for j in jits if (j / heal.QUARANTINE_DIR / qid).is_dir()), None)
        if holder is None:
            known = sorted(q.name for j in jits for q in heal.list_quarantines(j))
            raise heal.HealFailed(f"no quarantine {qid!r} (known: {', '.join(known) or 'none'})")
        with self.book.locked():
            self.recover(holder)
            io = self._io_for(holder)
            restored, displaced = owner_heal.restore(io, holder, qid, book=self.book)
        log.warning(
            "aiter.quarantine_restored",
            quarantine=qid,
            jit_dir=str(holder),
            modules=list(restored.modules),
            displaced=displaced.id if displaced is not None else None,
            verified=restored.verified,
            credentials=io.describe(),
        )
        return holder, restored, displaced

    def remember_restored(
        self,
        plans: list[plan.EnvPlan],
        memory: dict[str, plan.MemoryEntry],
        holder: Path,
        restored: heal.Quarantine,
        qid: str,
    ) -> None:
        """The restored modules are held (not healed again) until their tables or target
        change: remembered in ``memory`` with the verdicts ``plans`` make for them now."""
        for env_plan in plans:
            for mod in env_plan.modules:
                if mod.module in restored.modules and env_plan.jit_dir == holder:
                    memory[str(mod.so_path)] = plan.MemoryEntry(
                        mod.digest, frozenset(m.name for m in mod.missing), "restored", qid
                    )
        heal.save_memory(self.memory_file, memory)


def sample(mod: plan.ModulePlan, limit: int = 3) -> list[str]:
    """A few missing names with the rows that name them (``name @ table:line``)."""
    return [
        f"{m.name} @ {', '.join(f'{r.table}:{r.line}' for r in m.refs[:2])}"
        for m in mod.missing[:limit]
    ]
