from django.contrib import admin

from bookings.models import Booking, WebhookRun


@admin.register(Booking)
class BookingAdmin(admin.ModelAdmin):
    list_display = ["id", "slot", "customer", "location", "owner", "created_at"]
    list_filter = ["location"]


@admin.register(WebhookRun)
class WebhookRunAdmin(admin.ModelAdmin):
    list_display = ["id", "event", "received_at"]
