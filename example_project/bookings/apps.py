from django.apps import AppConfig


class BookingsConfig(AppConfig):
    name = "bookings"
    default_auto_field = "django.db.models.BigAutoField"
