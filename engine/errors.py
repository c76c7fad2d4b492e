"""Errors the engine raises to its callers."""


class RequestRejected(ValueError):
    """A request that can never run (too long for the model or the KV pool, bad token ids...).

    Raised by `add_request`, never after: a rejected request holds no resources and is not retried.
    """
