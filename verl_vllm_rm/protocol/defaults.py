"""Names and defaults both sides use: where the server listens, how the key and the parent are passed."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8001
DEFAULT_SERVER_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
API_KEY_ENV = "VERL_VLLM_RM_API_KEY"  # the trainer side's key (the server reads --api-key or $VLLM_API_KEY)
PARENT_PID_ENV = "VERL_VLLM_RM_PARENT_PID"  # the server exits when this process dies (set by the launcher)
SERVER_PID_ENV = "VERL_VLLM_RM_SERVER_PID"  # the engine's processes end when this API server process is gone
