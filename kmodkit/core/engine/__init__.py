"""The pure Module engine: from a Module, nodes, pods and images to the objects to create."""
