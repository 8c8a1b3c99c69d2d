"""Where reward servers come from: one server process (``launcher``), or replicas the plugin manages on verl's
Ray cluster (``fleet``: one Ray actor per replica, each owning one server process)."""
