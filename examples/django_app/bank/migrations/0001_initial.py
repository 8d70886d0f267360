"""The ``bank_order`` table."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    # Django's own declaration form (it copies both lists per instance).
    dependencies: list[tuple[str, str]] = []  # noqa: RUF012
    operations = [  # noqa: RUF012
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("account", models.CharField(max_length=200)),
                ("cents", models.IntegerField()),
                ("command_id", models.CharField(max_length=200)),
            ],
        ),
    ]
