"""The OpenAI-compatible HTTP gateway (`conveyor serve`): a stateless ASGI app over the Redis queue.

app.create_app(settings) builds it; settings.GatewaySettings is its one frozen configuration; auth, errors
and state hold what every router uses (the tenant of the API key, OpenAI's error objects, the Redis client).
"""
