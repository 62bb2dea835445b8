from django.urls import path

from tests.hangup.urls import urlpatterns as hangup_urlpatterns
from tests.hangup_matrix import views

urlpatterns = [
    *hangup_urlpatterns,
    path("form/", views.form_booking),
    path("form-hooks/<str:token>/", views.form_webhook),
    path("form-hooks/with-id/<str:token>/", views.form_webhook_with_id),
    path("keyed/sync/", views.keyed_sync),
    path("keyed/async/", views.keyed_async),
    path("keyed/drf/", views.keyed_drf),
    path("keyed/template/", views.keyed_template),
    path("keyed/async-template/", views.keyed_async_template),
    path("ninja/", views.api.urls),
]
