"""Weight updates into the running server (only with ``--enable-weight-updates``): the metadata routes, the one
weight-sync state, the gate between scoring and an update, applying it, the LoRA base store, and the worker
extension that receives the tensors."""
