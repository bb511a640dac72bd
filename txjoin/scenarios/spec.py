"""Scenario files: strict loading and validation of the YAML format (a public interface).

The format is specified in ``/SCENARIOS.md`` and documented field by field in
``scenarios/README.md``. Loading is strict: an unknown key, a missing required
field, a value of the wrong type, a row that does not fit the job's table, an
update of a row that does not exist, a selector naming an unknown transaction,
table or index: each is a :class:`~txjoin.errors.ScenarioError` (exit code 2 of
``txjoin replay``) whose message starts with ``<file>:<line>:`` and names the
field (``transactions[1].ops[0].row``).

YAML is parsed with a ``SafeLoader`` subclass whose mappings and sequences
remember the line of every key and item, so errors found long after parsing
(in :mod:`txjoin.scenarios.schedule`) can still point at the line.

Delivery rules that need the synthesized records (Kafka order within a topic,
every event delivered) are checked by
:func:`txjoin.scenarios.schedule.compile_schedule`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml

from txjoin.errors import JobError, ScenarioError
from txjoin.ingest.debezium import DEFAULT_TOPIC_PREFIX, Modes
from txjoin.ingest.types import ColumnValueError, column_kind, convert_value
from txjoin.job import Collect, Job, Table, load_job
from txjoin.join.oracle import RowChange, SourceTransaction

INVARIANTS: tuple[str, ...] = ("prefix_consistent", "final_equals_oracle", "exactly_once")
SNAPSHOT = "snapshot"
RESTART = "restart"

_TX_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_PREFIX = re.compile(r"^[A-Za-z0-9_.\-]+$")
_SELECTOR_TABLE = re.compile(r"^(?P<table>[^#\s]+)(?:#(?P<index>-?\d+))?$")


# -- YAML with line numbers ----------------------------------------------------------------


class YamlMap(dict[Any, Any]):
    """A YAML mapping that remembers its line and the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]


class YamlList(list[Any]):
    """A YAML sequence that remembers its line and the line of each item (1-based)."""

    line: int = 0
    item_lines: list[int]


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _Loader(yaml.SafeLoader):
    """SafeLoader whose containers carry line numbers; duplicate keys are errors."""


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> YamlMap:
    loader.flatten_mapping(node)
    result = YamlMap()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in result.key_lines:
            raise _DuplicateKey(key, line, result.key_lines[key])
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = line
    return result


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> YamlList:
    result = YamlList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


# -- the model -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """One delivery selector, resolved against the scenario (not yet against records).

    ``part`` is ``begin``, ``end``, ``*`` or a table name; ``index`` the i-th
    event of the transaction on that table (None: all of them).
    """

    text: str
    tx: str  # a transaction name or "snapshot"
    part: str
    index: int | None
    where: str  # the field, e.g. "delivery.batches[2][0]"
    line: int


@dataclass(frozen=True)
class BatchSpec:
    """One listed micro-batch: the union of its selectors."""

    number: int  # index among the listed batches (what `expect.frontier` refers to)
    selectors: tuple[Selector, ...]
    where: str
    line: int


@dataclass(frozen=True)
class RestartSpec:
    """A processor restart between two batches."""

    where: str
    line: int


@dataclass
class Expect:
    """What the output must look like: hand-written rows, frontier, invariants."""

    final: list[dict[str, Any]] | None = None
    frontier: dict[int, str | None] = field(default_factory=dict)
    invariants: tuple[str, ...] = INVARIANTS
    line: int = 0
    final_line: int = 0
    frontier_lines: dict[int, int] = field(default_factory=dict)


@dataclass
class Scenario:
    """A loaded, validated scenario file."""

    name: str
    about: str
    path: Path
    job: Job
    topic_prefix: str
    snapshot: dict[str, list[dict[str, Any]]]
    transactions: list[SourceTransaction]
    delivery: list[BatchSpec | RestartSpec] | None  # None: everything, one batch
    duplicate: list[Selector]
    withhold: list[Selector]
    expect: Expect
    delivery_line: int = 0
    transaction_lines: dict[str, int] = field(default_factory=dict)
    prefixes: dict[str, str] = field(default_factory=dict)
    """Source name -> topic prefix (one entry, ``default``, for a job without sources)."""

    @property
    def multi_source(self) -> bool:
        """The job declares sources (the ``sources:`` format of ``scenarios/README.md``)."""
        return bool(self.job.sources)

    @property
    def tx_names(self) -> list[str]:
        """Transaction names in commit (file) order; commit_seq c is ``tx_names[c - 1]``."""
        return [tx.name for tx in self.transactions]

    @property
    def listed_batches(self) -> int:
        """How many micro-batches the file lists (1 with the default delivery)."""
        if self.delivery is None:
            return 1
        return sum(1 for step in self.delivery if isinstance(step, BatchSpec))

    def where(self, line: int) -> str:
        """``<file>:<line>`` for messages."""
        return f"{self.path}:{line}"


# -- loading ---------------------------------------------------------------------------------


class _Reader:
    """Typed access to the parsed YAML with errors naming file, line and field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, line: int, where: str, message: str) -> NoReturn:
        raise ScenarioError(f"{self.path}:{line}: {where}: {message}")

    def mapping(self, value: Any, where: str, line: int, *, required: Iterable[Any] = (),
                optional: Iterable[Any] = (), hints: Mapping[str, str] | None = None
                ) -> YamlMap:
        if not isinstance(value, YamlMap):
            self.fail(line, where, f"expected a mapping, got {_kind(value)}")
        required, optional = tuple(required), tuple(optional)
        allowed = set(required) | set(optional)
        for key in value:
            if key not in allowed:
                hint = (hints or {}).get(str(key))
                self.fail(value.key_lines[key], _join(where, str(key)),
                          f"unknown key {key!r}; allowed here: "
                          f"{', '.join(sorted(map(str, allowed))) or 'nothing'}"
                          + (f" ({hint})" if hint else ""))
        for key in required:
            if key not in value:
                self.fail(value.line, where, f"missing required key {key!r}")
        return value

    def string(self, value: Any, where: str, line: int, *, empty: bool = False) -> str:
        if not isinstance(value, str) or (not empty and not value.strip()):
            self.fail(line, where, f"expected a non-empty string, got {_kind(value)}")
        return value

    def seq(self, value: Any, where: str, line: int) -> YamlList:
        if not isinstance(value, YamlList):
            self.fail(line, where, f"expected a list, got {_kind(value)}")
        return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, YamlMap):
        return "a mapping"
    if isinstance(value, YamlList):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _plain(value: Any) -> Any:
    """YAML containers -> plain dict/list; YAML dates -> ISO strings (Debezium has no dates)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return value


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate one scenario file; :class:`ScenarioError` (exit 2) if it is invalid."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read the scenario file: {exc}") from None
    r = _Reader(path)
    try:
        doc = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except _DuplicateKey as exc:
        raise ScenarioError(f"{path}:{exc.line}: key {exc.key!r} appears twice in one "
                            f"mapping (first at line {exc.first})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"{mark.line + 1}" if mark is not None else "?"
        where = f", column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ScenarioError(f"{path}:{line}: not valid YAML{where}: {problem}") from None
    if doc is None:
        raise ScenarioError(f"{path}:1: the file is empty")
    top = r.mapping(doc, "", 1, required=("name", "about", "job", "transactions"),
                    optional=("topic_prefix", "sources", "snapshot", "delivery", "expect"),
                    hints={"withhold": "it belongs under `delivery:`",
                           "duplicate": "it belongs under `delivery:`",
                           "batches": "it belongs under `delivery:`",
                           "final": "it belongs under `expect:`",
                           "frontier": "it belongs under `expect:`",
                           "invariants": "it belongs under `expect:`"})
    lines = top.key_lines
    name = r.string(top["name"], "name", lines["name"])
    about = r.string(top["about"], "about", lines["about"])
    job_ref = r.string(top["job"], "job", lines["job"])
    try:
        job = load_job((path.parent / job_ref).resolve())
    except JobError as exc:
        r.fail(lines["job"], "job", f"{exc} (the path is relative to the scenario file)")
    prefix = DEFAULT_TOPIC_PREFIX
    if "topic_prefix" in top:
        prefix = r.string(top["topic_prefix"], "topic_prefix", lines["topic_prefix"])
        if not _PREFIX.match(prefix):
            r.fail(lines["topic_prefix"], "topic_prefix",
                   f"{prefix!r} is not a valid topic prefix (letters, digits, . _ -)")

    prefixes = {"default": prefix}
    if job.sources:
        if "topic_prefix" in top:
            r.fail(lines["topic_prefix"], "topic_prefix",
                   f"job {job.name!r} reads several source databases "
                   f"({', '.join(job.source_names)}); give their prefixes under `sources:`")
        prefixes = _load_sources(r, top.get("sources"), lines.get("sources", 1), job)
        job = job.with_source_prefixes(prefixes)
        if job.semantics != "current":
            r.fail(lines["job"], "job",
                   f"job {job.name!r} reads several sources with semantics "
                   f"{job.semantics!r}; scenarios over several sources check `current` jobs "
                   f"only (with as_of_fact the output depends on the interleaving)")
    elif "sources" in top:
        r.fail(lines["sources"], "sources",
               f"job {job.name!r} declares no sources (one database); drop `sources:` or "
               f"declare Job(sources=[...]) in the job")

    model = _Model(r, job)
    snapshot: dict[str, list[dict[str, Any]]] = {}
    if "snapshot" in top and top["snapshot"] is not None:
        snapshot = model.load_snapshot(top["snapshot"], lines["snapshot"])
    transactions, tx_lines = model.load_transactions(top["transactions"], lines["transactions"])

    sel = _Selectors(r, job, snapshot, transactions)
    delivery: list[BatchSpec | RestartSpec] | None = None
    duplicate: list[Selector] = []
    withhold: list[Selector] = []
    delivery_line = 0
    if "delivery" in top and top["delivery"] is not None:
        delivery_line = lines["delivery"]
        d = r.mapping(top["delivery"], "delivery", delivery_line,
                      optional=("batches", "duplicate", "withhold"))
        if "batches" in d:
            delivery = sel.batches(d["batches"], "delivery.batches", d.key_lines["batches"])
        if "duplicate" in d:
            duplicate = sel.many(d["duplicate"], "delivery.duplicate", d.key_lines["duplicate"])
        if "withhold" in d:
            withhold = sel.many(d["withhold"], "delivery.withhold", d.key_lines["withhold"])

    listed = 1 if delivery is None else sum(isinstance(s, BatchSpec) for s in delivery)
    expect = Expect(invariants=tuple(i for i in INVARIANTS
                                     if not (withhold and i == "final_equals_oracle")))
    if "expect" in top and top["expect"] is not None:
        expect = _load_expect(r, top["expect"], lines["expect"], job, snapshot,
                              [t.name for t in transactions], listed, bool(withhold))
    if job.sources and expect.frontier:
        r.fail(expect.frontier_lines[min(expect.frontier)], "expect.frontier",
               "not available for a job over several sources (commit_seq counts applied "
               "transactions of both sources); rely on the invariants")
    return Scenario(name=name, about=about, path=path, job=job, topic_prefix=prefix,
                    snapshot=snapshot, transactions=transactions, delivery=delivery,
                    duplicate=duplicate, withhold=withhold, expect=expect,
                    delivery_line=delivery_line, transaction_lines=tx_lines,
                    prefixes=prefixes)


def _load_sources(r: _Reader, value: Any, line: int, job: Job) -> dict[str, str]:
    """``sources: {NAME: PREFIX, ...}``: topic prefixes overriding the job's Source prefixes."""
    overrides: dict[str, str] = {}
    if value is not None:
        m = r.mapping(value, "sources", line, optional=job.source_names)
        for name, raw in m.items():
            where = f"sources.{name}"
            prefix = r.string(raw, where, m.key_lines[name])
            if not _PREFIX.match(prefix):
                r.fail(m.key_lines[name], where,
                       f"{prefix!r} is not a valid topic prefix (letters, digits, . _ -)")
            overrides[str(name)] = prefix
    try:
        return job.source_prefixes(DEFAULT_TOPIC_PREFIX, overrides)
    except JobError as exc:
        r.fail(line, "sources", str(exc))


def load_scenarios(paths: Iterable[str | Path]) -> list[Scenario]:
    """Load several files; scenario names must be unique among them."""
    seen: dict[str, Path] = {}
    out = []
    for p in paths:
        sc = load_scenario(p)
        if sc.name in seen:
            raise ScenarioError(f"{sc.path}:1: name: {sc.name!r} is already the name of "
                                f"{seen[sc.name]}; scenario names must be unique")
        seen[sc.name] = sc.path
        out.append(sc)
    return out


# -- rows and transactions -------------------------------------------------------------------


class _Model:
    """The source tables as the file builds them up, to validate every operation."""

    def __init__(self, r: _Reader, job: Job) -> None:
        self.r = r
        self.job = job
        self.rows: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {
            t: {} for t in job.table_names}
        self.origin: dict[tuple[str, tuple[Any, ...]], str] = {}

    def table(self, value: Any, where: str, line: int) -> Table:
        name = self.r.string(value, where, line)
        if name not in self.job.table_names:
            self.r.fail(line, where, f"table {name!r} is not read by job {self.job.name!r} "
                                     f"(its tables: {', '.join(self.job.table_names)})")
        return self.job.table(name)

    def row(self, value: Any, table: Table, where: str, line: int, *,
            key_only: bool = False) -> dict[str, Any]:
        m = self.r.mapping(value, where, line,
                           required=table.key if key_only else (),
                           optional=() if key_only else tuple(table.columns))
        if not key_only:
            for col in table.key:
                if col not in m:
                    self.r.fail(m.line, where, f"the row lacks primary-key column {col!r} "
                                               f"of {table.name}")
        for col in table.key:
            if m[col] is None:
                self.r.fail(m.key_lines[col], _join(where, col),
                            f"primary-key column of {table.name} cannot be null")
        row = _plain(m)
        try:
            # Scenario files write values as text (decimals, base64 bytea), whatever the
            # job's connector does.
            table.convert_row(row, where="", modes=Modes())
        except ColumnValueError as exc:  # the hint is about a source, not a scenario file
            self.r.fail(line, where, exc.reason.lstrip(": "))
        except JobError as exc:
            self.r.fail(line, where, str(exc).lstrip(": "))
        return row

    def describe_key(self, table: Table, key: tuple[Any, ...]) -> str:
        return ", ".join(f"{c}={v!r}" for c, v in zip(table.key, key, strict=True))

    def load_snapshot(self, value: Any, line: int) -> dict[str, list[dict[str, Any]]]:
        m = self.r.mapping(value, "snapshot", line, optional=self.job.table_names)
        out: dict[str, list[dict[str, Any]]] = {}
        for tname, rows in m.items():
            where = f"snapshot.{tname}"
            table = self.job.table(tname)
            if rows is None:
                out[tname] = []
                continue
            items = self.r.seq(rows, where, m.key_lines[tname])
            out[tname] = []
            for i, item in enumerate(items):
                row = self.row(item, table, f"{where}[{i}]", items.item_lines[i])
                key = table.key_of(row)
                if key in self.rows[tname]:
                    self.r.fail(items.item_lines[i], f"{where}[{i}]",
                                f"a row with {self.describe_key(table, key)} is already in "
                                f"the snapshot ({self.origin[(tname, key)]})")
                full = {c: row.get(c) for c in table.columns}
                self.rows[tname][key] = full
                self.origin[(tname, key)] = f"{where}[{i}], line {items.item_lines[i]}"
                out[tname].append(full)
        return out

    def load_transactions(self, value: Any, line: int
                          ) -> tuple[list[SourceTransaction], dict[str, int]]:
        items = self.r.seq(value, "transactions", line)
        if not items:
            self.r.fail(line, "transactions", "lists no transaction")
        txs: list[SourceTransaction] = []
        tx_lines: dict[str, int] = {}
        for n, item in enumerate(items):
            where = f"transactions[{n}]"
            m = self.r.mapping(item, where, items.item_lines[n], required=("name", "ops"),
                               optional=("source",))
            source = self.source(m, where, items.item_lines[n])
            name = m["name"]
            if not isinstance(name, str) or not _TX_NAME.match(name):
                self.r.fail(m.key_lines["name"], f"{where}.name",
                            f"{name!r} is not a valid transaction name (a letter or _, then "
                            f"letters, digits, _ . -)")
            if name == SNAPSHOT:
                self.r.fail(m.key_lines["name"], f"{where}.name",
                            "'snapshot' is reserved (it names the initial snapshot)")
            if name in tx_lines:
                self.r.fail(m.key_lines["name"], f"{where}.name",
                            f"transaction name {name!r} is already used at line "
                            f"{tx_lines[name]}; names must be unique")
            tx_lines[name] = m.key_lines["name"]
            ops = self.r.seq(m["ops"], f"{where}.ops", m.key_lines["ops"])
            changes = [self.op(op, f"{where}.ops[{i}]", ops.item_lines[i], name)
                       for i, op in enumerate(ops)]
            if source is not None:
                for i, change in enumerate(changes):
                    if self.job.source_of(change.table) != source:
                        self.r.fail(ops.item_lines[i], f"{where}.ops[{i}]",
                                    f"{change.table} belongs to source "
                                    f"{self.job.source_of(change.table)!r}, not to this "
                                    f"transaction's source {source!r}; a transaction commits "
                                    f"in one database")
            txs.append(SourceTransaction(name, changes, source))
        return txs, tx_lines

    def source(self, m: YamlMap, where: str, line: int) -> str | None:
        """A transaction's ``source:``: required when the job declares sources, else refused."""
        names = self.job.source_names
        if not self.job.sources:
            if "source" in m:
                self.r.fail(m.key_lines["source"], f"{where}.source",
                            f"job {self.job.name!r} declares no sources; drop `source:`")
            return None
        if "source" not in m:
            self.r.fail(line, where, f"missing required key 'source' (the job reads several "
                                     f"databases: one of {', '.join(names)})")
        source = self.r.string(m["source"], f"{where}.source", m.key_lines["source"])
        if source not in names:
            self.r.fail(m.key_lines["source"], f"{where}.source",
                        f"unknown source {source!r}; the job's sources: {', '.join(names)}")
        return source

    def op(self, value: Any, where: str, line: int, tx: str) -> RowChange:
        if not isinstance(value, YamlMap):
            self.r.fail(line, where, f"expected a mapping like {{insert: schema.table, row: "
                                     f"{{...}}}}, got {_kind(value)}")
        kinds = [k for k in ("insert", "update", "delete") if k in value]
        if len(kinds) != 1:
            self.r.fail(line, where, "an operation has exactly one of the keys insert, update, "
                                     f"delete (found {kinds or 'none'})")
        kind: Literal["insert", "update", "delete"] = kinds[0]  # type: ignore[assignment]
        payload = "key" if kind == "delete" else "row"
        m = self.r.mapping(value, where, line, required=(kind, payload),
                           hints={"key": "a delete takes `key`, insert/update take `row`",
                                  "row": "a delete takes `key`, insert/update take `row`"})
        table = self.table(m[kind], f"{where}.{kind}", m.key_lines[kind])
        row = self.row(m[payload], table, f"{where}.{payload}", m.key_lines[payload],
                       key_only=kind == "delete")
        key = table.key_of(row)
        rows = self.rows[table.name]
        desc = f"{table.name} row with {self.describe_key(table, key)}"
        if kind == "insert":
            if key in rows:
                self.r.fail(m.key_lines[payload], f"{where}.row",
                            f"insert: the {desc} already exists ({self.origin[(table.name, key)]})"
                            f"; use `update`, or `delete` it first")
            # Debezium writes every column; an unlisted one is NULL.
            full = {c: row.get(c) for c in table.columns}
            rows[key] = full
            self.origin[(table.name, key)] = f"inserted by {tx} at line {line}"
            return RowChange("insert", table.name, full)
        if key not in rows:
            self.r.fail(m.key_lines[payload], f"{where}.{payload}",
                        f"{kind}: there is no {desc} at this point (not in the snapshot, or "
                        f"deleted before, or not yet inserted)")
        if kind == "update":
            # `row` is the full new row; an unlisted column keeps its value.
            full = {**rows[key], **row}
            rows[key] = full
            self.origin[(table.name, key)] = f"updated by {tx} at line {line}"
            return RowChange("update", table.name, full)
        del rows[key]
        self.origin[(table.name, key)] = f"deleted by {tx} at line {line}"
        return RowChange("delete", table.name, row)


# -- selectors --------------------------------------------------------------------------------


class _Selectors:
    """Parses selectors and checks they name something that exists."""

    def __init__(self, r: _Reader, job: Job, snapshot: Mapping[str, list[dict[str, Any]]],
                 transactions: list[SourceTransaction]) -> None:
        self.r = r
        self.job = job
        self.snapshot_rows = {t: len(rows) for t, rows in snapshot.items()}
        self.tx_counts: dict[str, dict[str, int]] = {}
        for tx in transactions:
            counts: dict[str, int] = {}
            for ch in tx.changes:
                counts[ch.table] = counts.get(ch.table, 0) + 1
            self.tx_counts[tx.name] = counts

    def one(self, value: Any, where: str, line: int) -> Selector:
        if not isinstance(value, str) or ":" not in value:
            self.r.fail(line, where, f"selector {value!r} is not '<tx>:begin', '<tx>:end', "
                                     f"'<tx>:*', '<tx>:<schema.table>[#i]', 'snapshot:*' or "
                                     f"'snapshot:<schema.table>'")
        tx, _, part = value.partition(":")
        tx, part = tx.strip(), part.strip()

        def bad(msg: str) -> NoReturn:
            self.r.fail(line, where, f"selector {value!r}: {msg}")

        if tx == SNAPSHOT:
            if part == "*":
                if not any(self.snapshot_rows.values()):
                    bad("the scenario has no snapshot rows")
                return Selector(value, tx, "*", None, where, line)
            if "#" in part:
                bad("snapshot rows are selected per table ('snapshot:<schema.table>') "
                    "or all at once ('snapshot:*')")
            self._check_table(part, bad)
            if not self.snapshot_rows.get(part):
                bad(f"the snapshot has no rows of {part}")
            return Selector(value, tx, part, None, where, line)
        if tx not in self.tx_counts:
            known = ", ".join(self.tx_counts) or "none"
            bad(f"unknown transaction {tx!r} (transactions: {known}; or 'snapshot')")
        if part in ("begin", "end", "*"):
            return Selector(value, tx, part, None, where, line)
        m = _SELECTOR_TABLE.match(part)
        if m is None:
            bad(f"{part!r} is not begin, end, *, <schema.table> or <schema.table>#<i>")
        table = m.group("table")
        self._check_table(table, bad)
        count = self.tx_counts[tx].get(table, 0)
        if count == 0:
            bad(f"transaction {tx} has no events on {table}")
        index = None
        if m.group("index") is not None:
            index = int(m.group("index"))
            if not 0 <= index < count:
                bad(f"index {index} is out of range: {tx} has {count} event(s) on {table} "
                    f"(0..{count - 1})")
        return Selector(value, tx, table, index, where, line)

    def _check_table(self, table: str, bad: Any) -> None:
        if table not in self.job.table_names:
            bad(f"unknown table {table!r} (job {self.job.name!r} reads "
                f"{', '.join(self.job.table_names)})")

    def many(self, value: Any, where: str, line: int) -> list[Selector]:
        items = self.r.seq(value, where, line)
        return [self.one(v, f"{where}[{i}]", items.item_lines[i]) for i, v in enumerate(items)]

    def batches(self, value: Any, where: str, line: int) -> list[BatchSpec | RestartSpec]:
        items = self.r.seq(value, where, line)
        out: list[BatchSpec | RestartSpec] = []
        number = 0
        for i, item in enumerate(items):
            here, item_line = f"{where}[{i}]", items.item_lines[i]
            if item == RESTART:
                out.append(RestartSpec(here, item_line))
                continue
            if not isinstance(item, YamlList):
                self.r.fail(item_line, here, f"a batch is a list of selectors or the word "
                                             f"'restart', got {_kind(item)}")
            out.append(BatchSpec(number, tuple(self.many(item, here, item_line)), here,
                                 item_line))
            number += 1
        if number == 0:
            self.r.fail(line, where, "lists no batch")
        return out


# -- expect -------------------------------------------------------------------------------------


def _load_expect(r: _Reader, value: Any, line: int, job: Job,
                 snapshot: Mapping[str, list[dict[str, Any]]], tx_names: list[str],
                 listed: int, withholding: bool) -> Expect:
    m = r.mapping(value, "expect", line, optional=("final", "frontier", "invariants"))
    expect = Expect(line=line)
    expect.invariants = tuple(i for i in INVARIANTS
                              if not (withholding and i == "final_equals_oracle"))
    if "final" in m:
        expect.final_line = m.key_lines["final"]
        rows = r.seq(m["final"], "expect.final", expect.final_line)
        expect.final = [_expect_row(r, row, f"expect.final[{i}]", rows.item_lines[i], job)
                        for i, row in enumerate(rows)]
    if "frontier" in m:
        f = r.mapping(m["frontier"], "expect.frontier", m.key_lines["frontier"],
                      optional=range(listed))
        has_snapshot = any(snapshot.values())
        for batch, name in f.items():
            here, fl = f"expect.frontier.{batch}", f.key_lines[batch]
            if name is not None and name not in tx_names and name != SNAPSHOT:
                r.fail(fl, here, f"{name!r} is not a transaction of this scenario (nor "
                                 f"'snapshot' or null)")
            if name == SNAPSHOT and not has_snapshot:
                r.fail(fl, here, "the scenario has no snapshot rows, so no output ever "
                                 "reflects only the snapshot")
            expect.frontier[int(batch)] = name
            expect.frontier_lines[int(batch)] = fl
    if "invariants" in m:
        items = r.seq(m["invariants"], "expect.invariants", m.key_lines["invariants"])
        chosen = []
        for i, item in enumerate(items):
            if item not in INVARIANTS:
                r.fail(items.item_lines[i], f"expect.invariants[{i}]",
                       f"unknown invariant {item!r}; known: {', '.join(INVARIANTS)}")
            chosen.append(item)
        expect.invariants = tuple(i for i in INVARIANTS if i in chosen)
    return expect


def _expect_row(r: _Reader, value: Any, where: str, line: int, job: Job) -> dict[str, Any]:
    columns = {**job.output.key, **job.output.columns}
    m = r.mapping(value, where, line, optional=tuple(columns))
    for name, proj in columns.items():
        if name not in m or not isinstance(proj, Collect) or m[name] is None:
            continue
        items = r.seq(m[name], f"{where}.{name}", m.key_lines[name])
        for i, element in enumerate(items):
            r.mapping(element, f"{where}.{name}[{i}]", items.item_lines[i],
                      optional=tuple(proj.fields))
    row: dict[str, Any] = _plain(m)
    types = job.output_types()
    for name, value in row.items():
        typ = types[name]
        if isinstance(typ, str):
            row[name] = _expected_value(r, value, typ, f"{where}.{name}", m.key_lines[name])
        elif isinstance(value, list):
            row[name] = [{f: _expected_value(r, v, typ[f], f"{where}.{name}[{i}].{f}",
                                             m.key_lines[name]) for f, v in item.items()}
                         if isinstance(item, dict) else item for i, item in enumerate(value)]
    return row


# Kinds whose values the checks cannot compare in their YAML spelling (an ISO date string
# against a date): `expect` values of these are read as the job reads the column.
_READ_IN_EXPECT = frozenset({"date", "time", "timetz", "interval", "uuid", "bytea", "numeric"})


def _expected_value(r: _Reader, value: Any, sql_type: str, where: str, line: int) -> Any:
    if value is None or column_kind(sql_type.removesuffix("[]"))[0] not in _READ_IN_EXPECT:
        return value
    try:
        return convert_value(value, sql_type)
    except ColumnValueError as exc:
        r.fail(line, where, exc.reason.lstrip(": "))
