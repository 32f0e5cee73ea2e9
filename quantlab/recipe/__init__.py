"""The recipe: the file a user writes (read, `extends:`, validated) and the schema of
each of its sections, in one home. The loader needs every section and the sections are
plain pydantic models, so keeping them together lets the floor (`core/`) and the
engines stay below the recipe without importing one another back."""
