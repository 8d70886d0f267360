"""The app's own table: an order, written in the same transaction as the command it stages."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    account = models.CharField(max_length=200)
    cents = models.IntegerField()
    command_id = models.CharField(max_length=200)
