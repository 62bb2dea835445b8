from django.contrib.auth.views import LoginView
from django.urls import path

from tests.testapp import ninja_api

urlpatterns = [
    path("accounts/login/", LoginView.as_view(template_name="registration/login.html")),
    path("ninja/", ninja_api.api.urls),
    path("ninja-whole/", ninja_api.whole_api.urls),
]
