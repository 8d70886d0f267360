"""A Flask app that calls actors from its (synchronous) views through ``akter.SyncRuntime``.

Run it with ``python examples/flask_app.py`` (``$AKTER_DATABASE_URL``, else an embedded
server); its test, ``tests/integration/test_example_flask.py``, drives it with Flask's own test
client. docs/guides/sync.md explains the rules: one SyncRuntime per process, started with the
app and stopped at its end, shared by every request thread.
"""

from __future__ import annotations

import os
from typing import Any, cast

from flask import Flask, Response, jsonify, request
from pydantic import BaseModel

import akter


class Funds(BaseModel):
    cents: int = 0


class Overdrawn(akter.DeclaredError, tag="flask_app.Overdrawn"):
    short: int


class Account(akter.Actor[Funds], access=akter.public):
    @akter.command
    async def deposit(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents

    @akter.command(errors=[Overdrawn])
    async def withdraw(self, cents: int) -> int:
        if cents > self.state.cents:
            raise Overdrawn(short=cents - self.state.cents)
        self.state.cents -= cents
        return self.state.cents

    @akter.query
    async def balance(self) -> int:
        return self.state.cents


def create_app(rt: akter.SyncRuntime) -> Flask:
    """The app: its views block on ``rt`` (a started SyncRuntime hosting ``Account``)."""
    app = Flask(__name__)

    @app.post("/accounts/<id>/deposit")
    def deposit(id: str) -> Response:
        cents = rt.get(Account, id).call(Account.deposit, cents=cents_of())
        return jsonify(cents=cents)

    @app.post("/accounts/<id>/withdraw")
    def withdraw(id: str) -> Response:
        # The caller's identity, for the actor's access policy and its receipt.
        with akter.as_caller(akter.User(request.headers.get("X-User", "anonymous"))):
            cents = rt.get(Account, id).call(Account.withdraw, cents=cents_of())
        return jsonify(cents=cents)

    @app.get("/accounts/<id>")
    def balance(id: str) -> Response:
        return jsonify(cents=rt.get(Account, id).call(Account.balance))

    @app.errorhandler(akter.DeclaredError)
    def declared(error: akter.DeclaredError) -> tuple[Response, int]:
        return jsonify(error=type(error).tag, fields=error.fields), 409

    @app.errorhandler(akter.ActorError)
    def refused(error: akter.ActorError) -> tuple[Response, int]:
        status = 400 if error.reason == "InvalidInput" else 503 if error.retryable else 500
        return jsonify(reason=error.reason, field=error.field, detail=error.message), status

    return app


def cents_of() -> Any:
    """The ``cents`` of the request's JSON body; the command validates it (``InvalidInput``)."""
    body = request.get_json(force=True, silent=True)
    return cast(dict[str, Any], body).get("cents") if isinstance(body, dict) else None


if __name__ == "__main__":
    with akter.SyncRuntime(actors=[Account], schema=os.environ.get("SCHEMA", "flask_app")) as rt:
        create_app(rt).run(port=int(os.environ.get("PORT", "5000")))
