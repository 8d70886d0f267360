"""The app's views: one calls an actor and waits; one stages a command in the app's transaction."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_POST

import akter
from examples.django_app.bank.actors import Account
from examples.django_app.bank.models import Order
from examples.django_app.bank.runtime import runtime


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _cents(request: HttpRequest) -> Any:
    """The body's ``cents``, as sent: the command validates it (``InvalidInput``)."""
    return _body(request).get("cents")


def _refused(error: akter.ActorError) -> JsonResponse:
    status = 400 if error.reason == "InvalidInput" else 503 if error.retryable else 500
    return JsonResponse({"reason": error.reason, "field": error.field}, status=status)


@require_POST
def deposit(request: HttpRequest, id: str) -> JsonResponse:
    """Deposit and wait for the turn: the SyncRuntime's blocking handle."""
    try:
        cents = runtime().get(Account, id).call(Account.deposit, cents=_cents(request))
    except akter.ActorError as error:
        return _refused(error)
    return JsonResponse({"cents": cents})


@require_GET
def balance(request: HttpRequest, id: str) -> JsonResponse:
    """The committed balance (a query)."""
    try:
        return JsonResponse({"cents": runtime().get(Account, id).call(Account.balance)})
    except akter.ActorError as error:
        return _refused(error)


class _Refused(Exception):
    """Rolls the order's transaction back (the ``fail`` flag of the request)."""


@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """Write an order and stage its deposit in one transaction: both commit, or neither.

    Needs no running akter runtime: staging writes a row in Django's own transaction; a runner
    (``manage.py akter_runner``, or any SyncRuntime of the app) delivers it after COMMIT.
    """
    body = _body(request)
    try:
        with transaction.atomic():
            order = Order.objects.create(account=str(body.get("account")), cents=0, command_id="")
            stager = akter.stage(connection, Account, order.account, schema=settings.AKTER_SCHEMA)
            order.command_id = stager.deposit(cents=_cents(request))
            order.cents = body["cents"]
            order.save()
            if body.get("fail"):
                raise _Refused
    except akter.ActorError as error:
        return _refused(error)
    except _Refused:
        return JsonResponse({"rolled_back": True}, status=409)
    return JsonResponse({"order": order.pk, "command_id": order.command_id}, status=202)
