"""The test project's URLs plus the views of tests/testapp/downstream_views.py and
docs/downstream.md's own blocks."""

from django.urls import include, path
from rest_framework.routers import SimpleRouter

from tests.docs_blocks import run_page_code
from tests.docs_examples import django_views
from tests.testapp import downstream_views as views
from tests.urls import urlpatterns as project_urlpatterns

examples = run_page_code("docs/downstream.md", {"__name__": __name__})
router = SimpleRouter()
router.register("bookings", views.RetainingBookingViewSet, basename="retaining")

urlpatterns = [
    path("downstream/charge/", views.charge),
    path("downstream/pay/", views.pay),
    path("downstream/middleware-charge/", views.middleware_charge),
    path("downstream/window-charge/", views.window_charge),
    path("downstream/async-charge/", views.async_charge),
    path("downstream/api-charge/", views.api_charge),
    path("downstream/hooks/<str:token>/", views.webhook_charge),
    path("downstream/ninja/", views.charges_api.urls),
    path("docs/invoices/<int:invoice_id>/pay/", examples["pay_invoice"]),
    path("docs/orders/<int:order_id>/ship/", examples["ship_order"]),
    path("docs/applications/", django_views.submit_application),
    path("retain/plain/", views.booking_answer),
    path("retain/validated/", views.validated_booking),
    path("retain/greedy/", views.greedy_booking),
    path("retain/ninja/", views.retaining_api.urls),
    path("retain/api/", include(router.urls)),
    *project_urlpatterns,
]
