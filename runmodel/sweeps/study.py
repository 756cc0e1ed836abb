"""The one adapter over Optuna: the storage object built for a sweep's study, used through
the public methods of Optuna's ``BaseStorage`` (and ``RDBStorage.record_heartbeat``), and
the study itself for what only it does (ask, tell, the sampler and the pruner).

A study lives in a journal file in the sweep's folder (one machine), or in a database
that ``--storage URL`` names (several machines). Only a database storage has heartbeats:
the sweep records one for each trial it runs, every ``heartbeat`` seconds, and fails a
trial whose last one is 3 times as old; Optuna's retry callback then adds a copy of it
(the same values, waiting) that the next ``ask`` of a living machine returns.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..extras import require
from .spec import PRUNERS, SAMPLERS, Spec, SweepError, SweepSpec

__all__ = ["JOURNAL", "Heartbeat", "SweepStudy", "connect"]

JOURNAL = "study.journal"
#: Times the values of a trial whose machine died are tried again.
RETRIES = 3
#: What each SQLAlchemy dialect's default driver is installed as.
DRIVERS = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "'psycopg[binary]'",
    "MySQLdb": "mysqlclient",
    "pymysql": "pymysql",
    "cx_Oracle": "cx_Oracle",
    "oracledb": "oracledb",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
}
DIALECTS = ("sqlite", "postgresql", "mysql", "mariadb", "oracle", "mssql")
#: Seconds a database connection may take before the server is called unreachable.
CONNECT_TIMEOUT = 10
#: Tries at making Optuna's tables, which machines starting together race for.
TABLE_RACES = 5
GRACE = 3  # a trial is stale once its last heartbeat is GRACE heartbeats old


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Optuna's warnings that do not concern a sweep: heartbeats are "supposed to be used
    with Study.optimize" (a sweep asks and tells, to keep Ctrl-C'd trials resumable), and
    the heartbeat's functions are "experimental"."""
    import optuna

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        yield


def shown(url: str) -> str:
    """``url`` without its password."""
    try:
        from sqlalchemy.engine import make_url

        return str(make_url(url).render_as_string(hide_password=True))
    except Exception:  # not a URL SQLAlchemy reads: shown as given
        return url


def connect(spec: SweepSpec, folder: Path) -> Any:
    """The storage of ``spec``'s study: the journal file in ``folder``, or the database
    ``spec.storage`` names, with heartbeats. A URL that cannot be used is one
    ``SweepError`` naming it and what to install or check; nothing is created then."""
    optuna = require("optuna", needed_by="runmodel sweep")
    if spec.storage is None:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return JournalStorage(JournalFileBackend(str(folder / JOURNAL)))
    url = spec.storage
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme.split("+")[0] not in DIALECTS:
        raise SweepError(
            f"--storage {shown(url)}: not a database URL Optuna can use; write "
            f"sqlite:///PATH, postgresql://USER:PASSWORD@HOST/DATABASE or "
            f"mysql://..., or leave --storage out for the sweep's own journal file"
        )
    import sqlalchemy.exc

    dialect = scheme.split("+")[0]
    # how long to wait for a busy SQLite file, or for a server to answer (the drivers of
    # PostgreSQL and MySQL take connect_timeout; others keep their own)
    timeout = {
        "sqlite": {"timeout": 60},
        "postgresql": {"connect_timeout": CONNECT_TIMEOUT},
        "mysql": {"connect_timeout": CONNECT_TIMEOUT},
        "mariadb": {"connect_timeout": CONNECT_TIMEOUT},
    }.get(dialect, {})
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    # Optuna 4.9 renamed failed_trial_callback
    named = "heartbeat_stale_trial_callback" if retry else "failed_trial_callback"
    try:
        with _quiet():
            callback = (retry or optuna.storages.RetryFailedTrialCallback)(max_retry=RETRIES)
            return _tables_made(
                lambda: optuna.storages.RDBStorage(
                    url,
                    engine_kwargs={"connect_args": timeout},
                    heartbeat_interval=spec.heartbeat,
                    grace_period=GRACE * spec.heartbeat,
                    **{named: callback},
                )
            )
    except ImportError as error:
        module = _missing(error)
        raise SweepError(
            f"--storage {shown(url)}: its driver {module!r} is not installed: "
            f"pip install {DRIVERS.get(module, module)}"
        ) from None
    except sqlalchemy.exc.ArgumentError as error:  # an unknown driver, a malformed URL
        raise SweepError(
            f"--storage {shown(url)}: {_first_line(error)}; write "
            f"sqlite:///PATH, postgresql://USER:PASSWORD@HOST/DATABASE or "
            f"mysql://..."
        ) from None
    except sqlalchemy.exc.OperationalError as error:
        where = (
            "check that its folder exists and can be written"
            if dialect == "sqlite"
            else "check that the server runs and is reachable from here, and the user, "
            "password and database name"
        )
        raise SweepError(
            f"--storage {shown(url)}: cannot connect ({_first_line(error.orig or error)}); {where}"
        ) from None
    except sqlalchemy.exc.DBAPIError as error:
        raise SweepError(
            f"--storage {shown(url)}: the database refused Optuna's tables "
            f"({_first_line(error.orig or error)}); check that the user may "
            f"create tables in it"
        ) from None


def _tables_made(storage: Callable[[], Any]) -> Any:
    """``storage()``, tried again where it lost the race for making Optuna's tables to
    another machine starting on the same empty database."""
    import sqlalchemy.exc

    attempt = 1
    while True:
        try:
            return storage()
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == TABLE_RACES:
                raise
            attempt += 1
            time.sleep(0.5 + random.random())  # the other has made them by then


def _missing(error: BaseException | None) -> str:
    """The module whose import failed (Optuna wraps the driver's ImportError in its own)."""
    while error is not None:
        if isinstance(error, ImportError) and error.name:
            return error.name
        error = error.__cause__ or error.__context__
    return "its driver"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


class Heartbeat:
    """A running trial's heartbeat, recorded now and then every ``interval`` seconds
    from a thread of the sweep's process until ``stop()``."""

    def __init__(self, storage: Any, trial_id: int, interval: int) -> None:
        self.storage, self.trial_id = storage, trial_id
        self._stopped = threading.Event()
        storage.record_heartbeat(trial_id)  # at once: a trial without one is never stale
        self._thread = threading.Thread(
            target=self._beat,
            args=(interval,),
            daemon=True,
            name=f"runmodel-sweep-heartbeat-{trial_id}",
        )
        self._thread.start()

    def _beat(self, interval: int) -> None:
        while not self._stopped.wait(interval):
            with contextlib.suppress(Exception):  # a busy database: the next one
                self.storage.record_heartbeat(self.trial_id)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


class SweepStudy:
    """A sweep's study and the storage object built for it. Trials are named by their
    number; their storage ids are asked of the storage."""

    def __init__(self, spec: SweepSpec, storage: Any, study: Any) -> None:
        self.spec, self.storage, self.study = spec, storage, study
        self.study_id = storage.get_study_id_from_name(spec.name)

    @classmethod
    def open(
        cls, spec: SweepSpec, folder: Path, storage: Any = None, *, create: bool = False
    ) -> SweepStudy:
        """The study of ``spec`` in ``storage`` (else ``connect(spec, folder)``); with
        ``create``, made if it is not there. A study of that name with another definition
        is refused before anything is written."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = connect(spec, folder) if storage is None else storage
        existing = cls.existing(spec, folder, storage)
        pruner = _made(spec.pruner, PRUNERS, optuna.pruners)  # not stored: a trial's
        if existing is None and not create:  # process decides with it
            raise SweepError(f"no sweep {spec.name!r} in {shown(spec.storage or str(folder))}")
        with _quiet():
            if existing is None:
                study = optuna.create_study(
                    study_name=spec.name,
                    storage=storage,
                    pruner=pruner,
                    load_if_exists=True,
                    sampler=_made(spec.sampler, SAMPLERS, optuna.samplers, seed=spec.seed),
                    direction="maximize" if spec.direction == "max" else "minimize",
                )
                study.set_user_attr("definition", spec.definition())
                return cls(spec, storage, study)
            # continued: a sampler seeded as at the start would repeat its values
            seed = spec.seed + len(storage.get_all_trials(existing, deepcopy=False))
            study = optuna.load_study(
                study_name=spec.name,
                storage=storage,
                pruner=pruner,
                sampler=_made(spec.sampler, SAMPLERS, optuna.samplers, seed=seed),
            )
        return cls(spec, storage, study)

    @staticmethod
    def existing(spec: SweepSpec, folder: Path, storage: Any) -> int | None:
        """The id of ``spec``'s study in ``storage``, None if there is none; a study of
        that name with another definition is a ``SweepError`` (nothing written)."""
        try:
            study_id = int(storage.get_study_id_from_name(spec.name))
        except KeyError:
            return None
        known = storage.get_study_user_attrs(study_id).get("definition")
        if known is not None and known != json.loads(json.dumps(spec.definition())):
            changed = sorted(k for k in known if known[k] != spec.definition().get(k))
            where = shown(spec.storage) if spec.storage else str(folder)
            raise SweepError(
                f"the sweep {spec.name!r} in {where} was started with other "
                f"{', '.join(changed)}; give this one another name ([sweep] "
                f"name, or the config's file name)"
            )
        return study_id

    # -- trials, by number ------------------------------------------------------------

    def trial_id(self, number: int) -> int:
        return int(self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number))

    def trial(self, number: int) -> Any:
        """The trial ``number`` as it is stored now (a ``FrozenTrial``)."""
        return self.storage.get_trial(self.trial_id(number))

    def trials(self, *states: Any) -> list[Any]:
        """The study's trials (in these states), by number."""
        return list(
            self.storage.get_all_trials(self.study_id, deepcopy=False, states=states or None)
        )

    def live(self, number: int) -> Any:
        """The trial ``number`` as an ``optuna.Trial``, to report to and ask the pruner."""
        import optuna

        return optuna.trial.Trial(self.study, self.trial_id(number))

    def set(self, number: int, key: str, value: Any) -> None:
        """Set the user attribute ``key`` of trial ``number``, unless the trial has
        ended (another sweep process failed it for a late heartbeat): then nothing."""
        from optuna.exceptions import UpdateFinishedTrialError

        with contextlib.suppress(UpdateFinishedTrialError):
            self.storage.set_trial_user_attr(self.trial_id(number), key, value)

    def ask(self, distributions: Mapping[str, Any]) -> int:
        """The number of a trial to run: a waiting one (a retried trial's copy) first,
        else a new one with values drawn by the sampler."""
        with _quiet():
            return int(self.study.ask(dict(distributions)).number)

    def tell(self, number: int, value: float | None = None, state: Any = None) -> None:
        self.study.tell(number, value, state=state, skip_if_finished=True)

    def counts(self) -> dict[str, int]:
        from optuna.trial import TrialState

        states = [t.state for t in self.trials()]
        return {
            "complete": states.count(TrialState.COMPLETE),
            "pruned": states.count(TrialState.PRUNED),
            "failed": states.count(TrialState.FAIL),
            "running": states.count(TrialState.RUNNING),
            "waiting": states.count(TrialState.WAITING),
        }

    # -- heartbeats (database storages) -----------------------------------------------

    @property
    def heartbeats(self) -> bool:
        """Whether this storage has heartbeats (a database one)."""
        return callable(getattr(self.storage, "record_heartbeat", None)) and bool(
            self.storage.get_heartbeat_interval()
        )

    def heartbeat(self, number: int) -> Heartbeat | None:
        """Start trial ``number``'s heartbeat (None where the storage has none)."""
        if not self.heartbeats:
            return None
        return Heartbeat(self.storage, self.trial_id(number), self.spec.heartbeat)

    def fail_stale(self) -> list[Any]:
        """Fail the running trials whose heartbeat stopped (their machine died), and
        return them; each is tried again as a waiting copy (Optuna's retry callback), at
        most ``RETRIES`` times."""
        if not self.heartbeats:
            return []
        import optuna
        from optuna.trial import TrialState

        running = {t.number for t in self.trials(TrialState.RUNNING)}
        with _quiet():
            optuna.storages.fail_stale_trials(self.study)
        return [t for t in self.trials(TrialState.FAIL) if t.number in running]


def _made(spec: Spec, kinds: Mapping[str, str], module: Any, **extra: Any) -> Any:
    cls = getattr(module, kinds[spec.type_])
    try:
        return cls(**{**extra, **spec.args}) if extra else cls(**spec.args)
    except TypeError as error:
        raise SweepError(f"{spec.type_}: {error}") from None
