"""The example's routes."""

from __future__ import annotations

from django.urls import path

from examples.django_app.bank import views

urlpatterns = [
    path("accounts/<str:id>/deposit", views.deposit),
    path("accounts/<str:id>", views.balance),
    path("orders", views.place_order),
]
