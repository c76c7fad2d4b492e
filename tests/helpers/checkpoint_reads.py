"""A stand-in for safetensors' safe_open that records what a loader reads from a checkpoint.

    log = ReadLog(); monkeypatch.setattr(engine.checkpoint, "safe_open", log.open)

`log.reads[name]`: the shape of every slice read of tensor `name`; `log.full[name]`: its whole shape.
Reading a whole tensor with get_tensor fails: loaders read through lazy slices only.
"""

from __future__ import annotations

from safetensors import safe_open


class ReadLog:
    """safe_open stand-in for the loader: records the shape of every slice read; reading a whole tensor
    with get_tensor fails."""

    def __init__(self) -> None:
        self.reads: dict[str, list[tuple[int, ...]]] = {}
        self.full: dict[str, tuple[int, ...]] = {}

    def open(self, path, framework, device):
        log, real = self, safe_open(path, framework=framework, device=device)

        class Handle:
            def __enter__(self):
                self.f = real.__enter__()
                return self

            def __exit__(self, *exc):
                return real.__exit__(*exc)

            def keys(self):
                return self.f.keys()

            def get_tensor(self, name):
                raise AssertionError(f"whole tensor {name} read")

            def get_slice(self, name):
                inner = self.f.get_slice(name)
                log.full[name] = tuple(inner.get_shape())

                class Slice:
                    def get_shape(self):
                        return inner.get_shape()

                    def __getitem__(self, index):
                        part = inner[index]
                        log.reads.setdefault(name, []).append(tuple(part.shape))
                        return part

                return Slice()

        return Handle()

    def whole(self) -> list[str]:
        """Matrices (2-D and up) read whole at least once."""
        return sorted(
            n for n, shapes in self.reads.items() if len(self.full[n]) >= 2 and self.full[n] in shapes
        )
