"""``python -m examples.django_app.manage akter_runner``: a runner of the app's actors.

It runs the actors' turns, delivers what views staged, runs jobs and workflows, until SIGINT or
SIGTERM; then it drains (in-flight turns finish, bounded by the drain deadline) and exits.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

import akter
from examples.django_app.bank.actors import Account


class Command(BaseCommand):
    help = "Run an akter runner for the bank's actors until SIGINT or SIGTERM, then drain."

    def handle(self, *args: Any, **options: Any) -> None:
        asyncio.run(self.serve())

    async def serve(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runtime = akter.Runtime(
            actors=[Account], database_url=settings.AKTER_DATABASE_URL, schema=settings.AKTER_SCHEMA
        )
        async with runtime:
            self.stdout.write(f"runner {runtime.runner_id} ready")
            self.stdout.flush()
            await stop.wait()
        assert runtime.last_drain is not None
        self.stdout.write(f"drained {runtime.last_drain.status}")
