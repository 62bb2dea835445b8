"""The test project's URLs plus tests/testapp/task_views.py's."""

from django.urls import path

from tests.testapp import task_views as views
from tests.urls import urlpatterns as project_urlpatterns

urlpatterns = [
    path("tasks/raw-key/", views.book_under_the_clients_key),
    path("tasks/downstream-key/", views.book_under_a_downstream_key),
    path("tasks/now/", views.book_now),
    *project_urlpatterns,
]
