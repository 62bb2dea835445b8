from django.contrib.auth.views import LoginView
from django.urls import path

from tests.hangup import views

urlpatterns = [
    path("accounts/login/", LoginView.as_view(template_name="registration/login.html")),
    path("sync/", views.sync_booking),
    path("template/", views.template_booking),
    path("hooked/", views.hooked_booking),
    path("unpaid/", views.unpaid_booking),
    path("async/", views.async_booking),
    path("decorated-async/", views.decorated_async_booking),
    path("decorated-sync/", views.decorated_sync_booking),
    path("hooks/<str:token>/", views.async_webhook),
    path("drf/", views.drf_booking),
    path("drf-atomic/", views.drf_atomic_booking),
    path("drf-retaining/", views.drf_retaining_booking),
]
