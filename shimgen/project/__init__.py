"""Project: the stages' results rendered into a Meson project (Jinja templates under templates/)."""
