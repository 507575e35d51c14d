"""What-if executor: the serving stack's own code on a VirtualClock, with a GPU cost model in
place of the model runner (see DESIGN.md "What-if executor")."""
