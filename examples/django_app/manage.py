"""Django's command line for the example: ``python -m examples.django_app.manage migrate``."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
