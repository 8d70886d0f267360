"""The console's ``allow`` rule sees the caller's tenant (issue 38, finding 8; docs/console.md).

The console shows every tenant's rows, so a rule that only looks at the subject lets a user
named "admin" in any tenant in. A two-argument rule ``(caller, tenant)`` gets the tenant the auth
provider established; the one-argument form keeps working (it simply cannot see the tenant).
"""

from __future__ import annotations

import pytest

import akter
from akter.http.console import Console
from tests.e2e.conftest import ACTORS, Account, Serve, assert_problem, token

pytestmark = pytest.mark.timeout(60)

HEADER = {"X-Akter-Console": "1"}
#: The operators, by tenant and subject (the documented, tenant-safe example).
OPERATORS = {("ops", "admin")}


def operators(caller: akter.User | akter.Anonymous, tenant: str) -> bool:
    return isinstance(caller, akter.User) and (tenant, caller.subject) in OPERATORS


async def test_console_allow_rule_sees_the_callers_tenant(served: Serve) -> None:
    seen: list[tuple[str, str]] = []

    async def recording(caller: akter.User | akter.Anonymous, tenant: str) -> bool:
        seen.append((tenant, getattr(caller, "subject", "")))
        return operators(caller, tenant)

    for rule in (operators, recording):
        async with served(ACTORS, app_options={"console": Console(allow=rule)}) as s:
            await s.t.get(Account, "a-1", tenant="acme").deposit(5)
            # Tenant acme's user "admin" is not the operators' "admin": refused, nothing read.
            impostor = s.http(token("admin", "acme"), headers=HEADER)
            refused = await impostor.get("/console/api/actors", params={"type": "Account"})
            assert_problem(refused, 403, "Unauthorized", "console_denied")
            assert "a-1" not in refused.text
            ops = s.http(token("admin", "ops"), headers=HEADER)
            listed = await ops.get("/console/api/actors", params={"type": "Account"})
            assert listed.status_code == 200, listed.text
            assert "a-1" in listed.text
    assert seen == [("acme", "admin"), ("ops", "admin")]


def test_console_rules_of_one_or_two_arguments_are_accepted_and_others_refused() -> None:
    def by_subject(caller: akter.User | akter.Anonymous) -> bool:
        return True

    assert Console(allow=by_subject).allow is by_subject
    assert Console(allow=operators).allow is operators
    with pytest.raises(TypeError, match=r"\(caller, tenant\)"):
        Console(allow=lambda: True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"\(caller, tenant\)"):
        Console(allow=lambda caller, tenant, extra: True)  # type: ignore[arg-type]


async def test_a_one_argument_rule_still_decides_alone() -> None:
    console = Console(allow=lambda caller: isinstance(caller, akter.User))
    assert await console.allows(akter.User("admin"), "acme") is True
    assert await console.allows(akter.Anonymous(), "acme") is False
    two = Console(allow=operators)
    assert await two.allows(akter.User("admin"), "ops") is True
    assert await two.allows(akter.User("admin"), "acme") is False
