# The native module: used through the distckpt package, whose stubs document the API.
from typing import Any

def __getattr__(name: str) -> Any: ...
