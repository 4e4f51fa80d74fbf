"""A release of one drafter: license rules, the license files, the model card, the folder, Hub publishing."""
