"""A Django project that calls akter from synchronous views (docs/guides/sync.md, "Django").

The ``bank`` app: a view that calls an actor and waits (the process's ``akter.SyncRuntime``,
``bank/runtime.py``), a view that stages a command in ``transaction.atomic()`` beside the app's
own write (``akter.stage(connection, ...)``), and the ``akter_runner`` management command that
delivers what views staged. To run it on your PostgreSQL (the schema ``bank`` holds akter's
tables and the app's; it must exist before Django's ``migrate``, so start the runner first or
create it)::

    export AKTER_DATABASE_URL=postgresql://postgres@127.0.0.1/test
    python -m examples.django_app.manage akter_runner &  # "runner … ready": the schema exists
    python -m examples.django_app.manage migrate bank
    python -m examples.django_app.manage runserver

Its test, ``tests/integration/test_example_django.py``, does the same with ``django.test.Client``
on a schema of its own per run.
"""
