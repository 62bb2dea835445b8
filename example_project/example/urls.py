from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from rest_framework.routers import DefaultRouter

from bookings import ninja_api, views, webhooks

router = DefaultRouter()
router.register("bookings", views.BookingViewSet, basename="booking")

urlpatterns = [
    path("", views.index, name="index"),
    path("admin/", admin.site.urls),
    path("api/", include(router.urls)),
    path("ninja/", ninja_api.api.urls),  # the same booking operation over django-ninja
    path("plain/bookings/", views.plain_create_booking, name="plain-bookings"),
    # Idempotency-Key, else the fallback: the trigger token and the body, in a time bucket.
    path("hooks/<str:token>/", webhooks.webhook_receiver, name="webhook"),
    # A signature verified first, then the webhook-id it covers.
    path(
        "standard-hooks/<str:token>/", webhooks.standard_webhook_receiver, name="standard-webhook"
    ),
]

if "drf_spectacular" in settings.INSTALLED_APPS:
    from drf_spectacular.views import SpectacularAPIView

    urlpatterns.append(path("api/schema/", SpectacularAPIView.as_view(), name="schema"))
