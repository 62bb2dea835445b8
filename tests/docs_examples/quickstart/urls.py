"""The quickstart's mysite/urls.py: it replaces the one startproject made."""

# --8<-- [start:urls]
from django.contrib import admin
from django.urls import include, path
from rest_framework.routers import DefaultRouter

from bookings.views import BookingViewSet

router = DefaultRouter()
router.register("bookings", BookingViewSet, basename="booking")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include(router.urls)),
]
# --8<-- [end:urls]
