"""What a client command (`conveyor submit`, `conveyor batch`) prints when Redis or the workers fail it:
one line naming the cause, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click
import redis
from redis.exceptions import RedisClusterException

from worker.cli.preflight import safe_url
from worker.client import NoAnswer


@contextmanager
def one_line_errors(url: str, resume_hint: str = "") -> Iterator[None]:
    where = safe_url(url)
    try:
        yield
    except NoAnswer as exc:  # (a TimeoutError, so an OSError: before those)
        raise click.ClickException(f"{exc}{resume_hint}") from None
    except redis.AuthenticationError as exc:
        raise click.ClickException(
            f"Redis at {where} refused the credentials in --redis-url: {exc}"
        ) from None
    except redis.TimeoutError as exc:
        raise click.ClickException(f"Redis at {where} did not answer in time: {exc}{resume_hint}") from None
    except (redis.ConnectionError, OSError) as exc:
        raise click.ClickException(f"cannot reach Redis at {where}: {exc}{resume_hint}") from None
    except (redis.ResponseError, RedisClusterException) as exc:
        raise click.ClickException(f"Redis at {where} refused the request: {exc}") from None
