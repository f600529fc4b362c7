"""What pool admins set: projects and departments (their specs and rules) and the changes admins
make to them, whatever asks."""
