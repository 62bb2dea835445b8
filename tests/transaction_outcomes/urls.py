from django.urls import path

from tests.transaction_outcomes import views

urlpatterns = [
    path("rolled-back/", views.rolled_back),
    path("queued/", views.queued),
    path("order-then-task/", views.order_then_task),
    path("cancel/", views.cancel),
    path("forbidden/", views.forbidden),
    path("decorated-rolled-back/", views.decorated_rolled_back),
    path("drf-rolled-back/", views.drf_rolled_back),
    path("viewset-rolled-back/", views.RolledBackViewSet.as_view({"post": "create"})),
    path("booking/", views.booking),
    path("decorated-booking/", views.decorated_booking),
    path("drf-booking/", views.drf_booking),
    path("drf-plain-booking/", views.drf_plain_booking),
    path("two-databases/", views.two_databases),
    path("swallowed-error/", views.swallowed_error),
    path("drf-swallowed-error/", views.drf_swallowed_error),
    path("no-response-atomic/", views.NoResponseAtomicViewSet.as_view({"post": "create"})),
    path("no-response/", views.NoResponseViewSet.as_view({"post": "create"})),
]
