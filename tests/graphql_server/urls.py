from django.urls import path
from strawberry.django.views import AsyncGraphQLView, GraphQLView

from idempotency_django.decorators import idempotency_exempt
from tests.graphql_server.schema import schema

# --8<-- [start:urls]
# The mutations claim their own keys: the middleware leaves the endpoint to them.
urlpatterns = [
    path("graphql/", idempotency_exempt(GraphQLView.as_view(schema=schema))),
    path("async-graphql/", idempotency_exempt(AsyncGraphQLView.as_view(schema=schema))),
]
# --8<-- [end:urls]
