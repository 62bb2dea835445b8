from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from idempotency_django import idempotent

RUNS = {"count": 0}


@csrf_exempt
@idempotent(required=True)
def book(request: HttpRequest) -> JsonResponse:
    RUNS["count"] += 1
    return JsonResponse({"run": RUNS["count"]}, status=201)


urlpatterns = [path("admin/", admin.site.urls), path("book/", book)]
