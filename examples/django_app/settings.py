"""Settings of the Django example project (docs/guides/sync.md, "Django").

The database is ``$AKTER_DATABASE_URL`` (a PostgreSQL URL); ``$DJANGO_APP_SCHEMA`` (default
``bank``) is the schema of both akter's tables and the app's own, so that one transaction of
Django's connection holds the app's write and the command it stages. A test run picks a schema of
its own, so that concurrent runs never collide.
"""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_url = conninfo_to_dict(os.environ.get("AKTER_DATABASE_URL", "postgresql://postgres@127.0.0.1/"))

#: The schema of akter's tables and of the app's tables (Django reaches it by search_path).
AKTER_SCHEMA = os.environ.get("DJANGO_APP_SCHEMA", "bank")

SECRET_KEY = "an example's key: never use it in production"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "examples.django_app.urls"
INSTALLED_APPS = ["examples.django_app.bank"]
MIDDLEWARE: list[str] = []
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.get("dbname", "postgres"),
        "USER": _url.get("user", ""),
        "PASSWORD": _url.get("password", ""),
        "HOST": _url.get("host", ""),
        "PORT": _url.get("port", ""),
        "OPTIONS": {"options": f"-c search_path={AKTER_SCHEMA}"},
    }
}

#: akter's database: the same server and database as Django's.
AKTER_DATABASE_URL = os.environ.get("AKTER_DATABASE_URL", "postgresql://postgres@127.0.0.1/")
