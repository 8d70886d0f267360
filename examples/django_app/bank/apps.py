"""The bank app."""

from __future__ import annotations

from django.apps import AppConfig


class BankConfig(AppConfig):
    name = "examples.django_app.bank"
    label = "bank"
