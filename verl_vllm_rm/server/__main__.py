import sys

from verl_vllm_rm.server.model_path import check_model_argument

if __name__ == "__main__":
    check_model_argument(sys.argv[1:])  # before vLLM's import (server.entry): a wrong path is said at once
    from verl_vllm_rm.server.entry import main

    main()
