from verl_vllm_rm.server.entry import main

if __name__ == "__main__":
    main()
