from django.contrib.auth.views import LoginView
from django.urls import path

from tests.hangup import a2s_views, views

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
    path("a2s/decorated/", a2s_views.decorated),
    path("a2s/drf/", a2s_views.drf),
    path("a2s/hooks/<str:token>/", a2s_views.webhook),
    path("a2s/", a2s_views.api.urls),
    path("a2s/signalled/", a2s_views.signalled),
]
