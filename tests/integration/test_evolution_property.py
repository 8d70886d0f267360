"""Evolution E1 as a property: deploys of a state model over actors written by earlier code.

An example is a sequence of deploys of one actor type (a fresh stored name per example), each
one step from the last code: add a defaulted field (no migration), rename a field (a migration),
or split a text field into two (a migration). A population of actors is written by the first
code; after each deploy a runtime with the new code (a new runner on the same schema) reads every
actor, then writes some of them. The prediction is kept apart from the code, as plain values:

- every actor read through the new code equals its logical value (the declared migrations'
  meaning applied to what was last written, defaults for what never was): nothing is lost,
  nothing else changes;
- reads write nothing, and a row no command wrote keeps its JSON and its old state version;
- a written row holds the logical value at the code's state version.

Pending intents ride along (evolution E3): a sender type stages ``add(k)`` intents to the
actors, with the relay off, under whichever code is deployed; a deploy step may also rename
``add``'s parameter (a payload version with its migration). Some deploys deliver every pending
intent: each is delivered exactly once, through the chain from the version it was staged at,
and adds its ``k`` to its actor's ``n`` (the row is then written at the code's state version);
none is parked.

Two versions interleaved (evolution E4, issue 38): an ``overlap`` deploy adds a defaulted field
(the same state version) and runs the older code beside the newer one before the older stops.
Each write goes through the older runner first — served, when the newer one has not written that
actor's row; refused with ``StateTooNew`` (retryable, nothing written), when it has — then
through the newer runner. The older runner's queries serve its own view of every row.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import create_model

import akter
from akter.testing import ActorTest
from tests._support.citus import ON_CITUS
from tests._support.polling import until

ACTORS = ("a0", "a1", "a2", "a3")
#: a3 is never written by the first code: its value is the defaults of whichever code reads it.
WRITTEN_FIRST = ACTORS[:3]
Migrate = Callable[[dict[str, Any]], dict[str, Any]]
#: What the examples exercised: intents delivered, and those delivered through a payload chain.
COVERAGE = {"delivered": 0, "migrated": 0, "too_new": 0, "older_wrote": 0}


@dataclass
class Code:
    """One deployed version of the state model: its text fields and its migrations."""

    fields: dict[str, str]  # name -> default, in declaration order
    migrations: list[Migrate] = field(default_factory=list)
    serial: int = 0
    #: The name of ``add``'s one parameter, and the payload migrations that renamed it.
    param: str = "k"
    payload_migrations: list[Migrate] = field(default_factory=list)

    @property
    def version(self) -> int:
        return len(self.migrations)

    @property
    def version_of_payload(self) -> int:
        return len(self.payload_migrations)

    def fresh(self, base: str) -> str:
        self.serial += 1
        return f"{base}{self.serial}"


@dataclass
class World:
    """The prediction: each actor's logical value, and what its row should hold."""

    code: Code
    logical: dict[str, dict[str, Any]]
    #: actor id -> (stored JSON, stored state version); absent: no row.
    rows: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    #: Intents staged and not yet delivered: (target actor, k, payload version staged at).
    pending: list[tuple[str, int, int]] = field(default_factory=list)

    def defaults(self) -> dict[str, Any]:
        return {"n": 0, **self.code.fields}


def split(text: str) -> tuple[str, str]:
    head, _, tail = text.partition(" ")
    return head, tail


# --- deploy steps: each changes the code and the logical values in the same way -------------


def add_field(world: World, default: str) -> None:
    name = world.code.fresh("f")
    world.code.fields[name] = default
    for value in world.logical.values():
        value[name] = default


def rename_field(world: World, old: str) -> None:
    code = world.code
    new = code.fresh("r")
    code.fields = {(new if k == old else k): v for k, v in code.fields.items()}

    def move(state: dict[str, Any]) -> dict[str, Any]:
        if old in state:  # a row written before the field existed lacks it: the default holds
            state[new] = state.pop(old)
        return state

    code.migrations.append(move)
    for value in world.logical.values():
        value[new] = value.pop(old)


def split_field(world: World, old: str) -> None:
    code = world.code
    head, tail = code.fresh("h"), code.fresh("t")
    default_head, default_tail = split(code.fields.pop(old))
    code.fields.update({head: default_head, tail: default_tail})

    def cut(state: dict[str, Any]) -> dict[str, Any]:
        if old in state:
            state[head], state[tail] = split(state.pop(old))
        return state

    code.migrations.append(cut)
    for value in world.logical.values():
        value[head], value[tail] = split(value.pop(old))


def bump_payload(world: World) -> None:
    """``add(k)`` becomes ``add(<new name>)``: payload version + 1, with its migration."""
    code = world.code
    old, new = code.param, code.fresh("p")

    def rename(payload: dict[str, Any]) -> dict[str, Any]:
        return {new: payload.pop(old), **payload}

    code.param = new
    code.payload_migrations.append(rename)


def deploy(world: World, step: str, pick: int, default: str) -> None:
    names = list(world.code.fields)
    if step == "bump":
        bump_payload(world)
    elif step in ("add", "overlap") or not names:
        add_field(world, default)
    elif step == "rename":
        rename_field(world, names[pick % len(names)])
    else:
        split_field(world, names[pick % len(names)])


# --- the code of one version, as an actor class ---------------------------------------------


def actor_class(type_name: str, code: Code) -> Any:
    model = create_model(  # type: ignore[call-overload]
        f"{type_name}V{code.version}",
        n=(int, 0),
        **{name: (str, default) for name, default in code.fields.items()},
    )

    async def put(self: Any, field: str, value: str) -> int:
        setattr(self.state, field, value)
        self.state.n += 1
        return int(self.state.n)

    async def show(self: Any) -> dict[str, Any]:
        return cast(dict[str, Any], self.state.model_dump())

    body: dict[str, Any] = {"put": akter.command(put), "show": akter.query(show)}
    for version, fn in enumerate(code.migrations):
        body[f"_m{version}"] = akter.migrate_state(from_version=version)(fn)
    add: Any = akter.command(version=len(code.payload_migrations))(_add_handler(code.param))
    for version, fn in enumerate(code.payload_migrations):
        add.migrate_payload(from_version=version)(fn)
    body["add"] = add
    base = cast(Any, akter.Actor)[model]
    keywords = {"name": type_name, "access": akter.public}
    return types.new_class(type_name, (base,), keywords, lambda ns: ns.update(body))


def _add_handler(param: str) -> Any:
    """``async def add(self, <param>: int) -> int``: adds to ``n`` (the parameter's name varies)."""
    namespace: dict[str, Any] = {}
    exec(
        f"async def add(self, {param}: int) -> int:\n"
        f"    self.state.n += {param}\n"
        "    return self.state.n\n",
        namespace,
    )
    return namespace["add"]


def sender_class(type_name: str, target: Any) -> Any:
    """The type that stages ``target.add(k)`` intents (its own rows are not in the world)."""

    async def stage(self: Any, actor: str, k: int) -> None:
        self.send(target.add, actor, k)

    body: dict[str, Any] = {"stage": akter.command(stage)}
    keywords = {"name": f"{type_name}Sender", "access": akter.public}
    return types.new_class(
        f"{type_name}Sender", (akter.Actor,), keywords, lambda ns: ns.update(body)
    )


async def rows_of(t: ActorTest, type_name: str) -> dict[str, tuple[dict[str, Any], int]]:
    found = await t.rows(
        "SELECT actor_id, state, state_version FROM {schema}.actors WHERE actor_type = %(t)s",
        {"t": type_name},
    )
    return {r["actor_id"]: (r["state"], r["state_version"]) for r in found}


async def put(
    runtime: akter.Runtime, cls: Any, world: World, actor: str, pick: int, text: str
) -> None:
    """A writing command under the current code; the prediction follows it."""
    names = list(world.code.fields)  # never empty: no step removes a field without a successor
    name = names[pick % len(names)]
    value = world.logical[actor]
    assert await runtime.get(cls, actor).put(name, text) == value["n"] + 1
    value[name] = text
    value["n"] += 1
    world.rows[actor] = (dict(value), world.code.version)


async def _after_deploy(t: ActorTest, runtime: akter.Runtime, cls: Any, world: World) -> None:
    """Every actor reads as predicted; reads wrote nothing; unwritten rows kept their version."""
    type_name = runtime.definition(cls).name
    assert await rows_of(t, type_name) == world.rows
    for actor in ACTORS:
        assert await runtime.get(cls, actor).show() == world.logical[actor], actor
    assert await rows_of(t, type_name) == world.rows, "a query wrote"


async def _stage(
    runtime: akter.Runtime, sender: Any, world: World, stages: list[tuple[int, int]]
) -> None:
    for index, k in stages:
        await runtime.get(sender, "s").stage(ACTORS[index], k)
        world.pending.append((ACTORS[index], k, world.code.version_of_payload))


async def _deliver(t: ActorTest, cls: Any, sender: Any, world: World) -> None:
    """A runner with the relay on delivers every pending intent, each exactly once."""
    type_name = akter.actor.definition_of(cls).name
    staged = await t.rows(
        "SELECT payload_version FROM {schema}.outbox WHERE target_type = %(t)s",
        {"t": type_name},
    )
    assert sorted(r["payload_version"] for r in staged) == sorted(v for *_, v in world.pending)
    runtime = akter.Runtime(
        [cls, sender], database_url=t.database_url, schema=t.schema, relay=True, poll=0.05
    )
    async with runtime:
        left = await until(
            lambda: t.rows(
                "SELECT intent_id, parked_at_ms, last_error FROM {schema}.outbox"
                " WHERE target_type = %(t)s",
                {"t": type_name},
            ),
            holds=lambda rows: not rows or any(r["parked_at_ms"] for r in rows),
            what="every pending intent to be delivered",
        )
    assert left == [], f"parked or left: {left}"
    COVERAGE["delivered"] += len(world.pending)
    COVERAGE["migrated"] += sum(v < world.code.version_of_payload for *_, v in world.pending)
    for actor, k, _ in world.pending:
        world.logical[actor]["n"] += k
    for actor in {actor for actor, _, _ in world.pending}:
        world.rows[actor] = (dict(world.logical[actor]), world.code.version)
    world.pending.clear()


async def _overlap(
    t: ActorTest, old: Any, new: Any, old_fields: list[str], world: World, writes: Writes
) -> None:
    """The older code (``old``, fields ``old_fields``) runs beside the newer (module docstring)."""
    type_name = akter.actor.definition_of(new).name
    added = [f for f in world.code.fields if f not in old_fields]
    newer = await _start(t, new)
    older = await _start(t, old)
    # Rows that carry a key the older code lacks: the newer code wrote them (a delivery).
    touched = {a for a, (state, _) in world.rows.items() if any(k in state for k in added)}
    try:
        for index, pick, text in [*writes, *((i, 0, "z") for i in range(len(ACTORS)))]:
            actor = ACTORS[index]
            value = world.logical[actor]
            name = old_fields[pick % len(old_fields)]
            if actor in touched:  # the newer code wrote it: the older one must not overwrite
                before = await rows_of(t, type_name)
                with pytest.raises(akter.ActorError) as info:
                    await older.get(old, actor).put(name, text)
                assert info.value.reason == "StateTooNew" and info.value.retryable, info.value
                assert await rows_of(t, type_name) == before
                COVERAGE["too_new"] += 1
            else:
                assert await older.get(old, actor).put(name, text) == value["n"] + 1
                value[name] = text
                value["n"] += 1
                stored = {k: v for k, v in value.items() if k not in added}
                world.rows[actor] = (stored, world.code.version)
                COVERAGE["older_wrote"] += 1
            if (index, pick, text) in writes:
                await put(newer, new, world, actor, pick, text)
                touched.add(actor)
        assert await rows_of(t, type_name) == world.rows
        for actor in ACTORS:  # a query never writes: the older code serves its own view
            view = {k: v for k, v in world.logical[actor].items() if k not in added}
            assert await older.get(old, actor).show() == view, actor
    finally:
        await older.stop()
        await newer.stop()


async def _check_reads(t: ActorTest, cls: Any, world: World) -> None:
    runtime = await _start(t, cls)
    try:
        await _after_deploy(t, runtime, cls, world)
    finally:
        await runtime.stop()


async def _start(t: ActorTest, *classes: Any) -> akter.Runtime:
    """A runner with this code on the harness's schema (stopped by the example)."""
    runtime = akter.Runtime(
        list(classes), database_url=t.database_url, schema=t.schema, relay=False
    )
    await runtime.start()
    return runtime


Writes = list[tuple[int, int, str]]
Stages = list[tuple[int, int]]
#: (deploy step, pick, default, writes, intents staged after it, deliver before the writes?)
Step = tuple[str, int, str, Writes, Stages, bool]
TEXT = st.text(alphabet="ab ", max_size=5)
STAGES = st.lists(st.tuples(st.integers(0, len(ACTORS) - 1), st.integers(1, 9)), max_size=2)
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "rename", "split", "bump", "overlap"]),
        st.integers(0, 7),
        TEXT,
        st.lists(st.tuples(st.integers(0, len(ACTORS) - 1), st.integers(0, 7), TEXT), max_size=3),
        STAGES,
        st.booleans(),
    ),
    min_size=1,
    max_size=3,
)
FIRST = st.lists(
    st.tuples(st.integers(0, 7), TEXT), min_size=len(WRITTEN_FIRST), max_size=len(WRITTEN_FIRST)
)


async def _example(
    t: ActorTest,
    type_name: str,
    first: list[tuple[int, str]],
    first_stages: Stages,
    steps: list[Step],
) -> None:
    code = Code({"f0": "x y", "g0": ""})
    world = World(code, {a: {"n": 0, **code.fields} for a in ACTORS})
    cls = actor_class(type_name, code)
    sender = sender_class(type_name, cls)
    runtime = await _start(t, cls, sender)
    try:
        for actor, (pick, text) in zip(WRITTEN_FIRST, first, strict=True):
            await put(runtime, cls, world, actor, pick, text)
        await _stage(runtime, sender, world, first_stages)
    finally:
        await runtime.stop()
    for step, pick, default, writes, stages, deliver in steps:
        old, old_fields = cls, list(world.code.fields)
        deploy(world, step, pick, default)
        cls = actor_class(type_name, world.code)
        sender = sender_class(type_name, cls)
        runtime = await _start(t, cls, sender)
        try:
            await _after_deploy(t, runtime, cls, world)
        finally:
            await runtime.stop()
        if deliver and world.pending:
            await _deliver(t, cls, sender, world)
        if step == "overlap":
            await _overlap(t, old, cls, old_fields, world, writes)
            writes = []
        runtime = await _start(t, cls, sender)
        try:
            for index, field_pick, text in writes:
                await put(runtime, cls, world, ACTORS[index], field_pick, text)
            await _stage(runtime, sender, world, stages)
            assert await rows_of(t, type_name) == world.rows
        finally:
            await runtime.stop()
    if world.pending:  # the last code delivers what is left, whatever version it was staged at
        await _deliver(t, cls, sender, world)
        await _check_reads(t, cls, world)


class Anchor(akter.Actor[akter.actor.EmptyState]):
    """The harness's own type (each example deploys its own)."""


def _check_property(akter_db: str, **options: Any) -> None:
    """Run the property on one schema (its own event loop: Hypothesis drives it from sync code)."""
    loop = asyncio.new_event_loop()
    t = ActorTest([Anchor], database_url=akter_db, relay=False)
    loop.run_until_complete(t.__aenter__())
    serial = iter(range(1_000_000))
    try:

        @settings(
            deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow], **options
        )
        @given(first=FIRST, first_stages=STAGES, steps=STEPS)
        def example(first: list[tuple[int, str]], first_stages: Stages, steps: list[Step]) -> None:
            loop.run_until_complete(_example(t, f"Evo{next(serial)}", first, first_stages, steps))

        example()
    finally:
        loop.run_until_complete(t.__aexit__(None, None, None))
        loop.close()


# Twelve deploys with their runtimes: about 1 min on one server, several on distributed tables.
@pytest.mark.timeout(600 if ON_CITUS else 120)
def test_evolution_property_deploys_over_old_rows(akter_db: str) -> None:
    before = dict(COVERAGE)
    _check_property(akter_db, max_examples=12, derandomize=True)
    # The fixed examples must reach the interesting cases, or the property proves little.
    for case in ("migrated", "too_new", "older_wrote"):
        assert COVERAGE[case] > before[case], (case, COVERAGE)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_evolution_property_many_deploys(akter_db: str) -> None:
    """The same property with more (random) examples (about 1–2 s each)."""
    _check_property(akter_db, max_examples=60)
