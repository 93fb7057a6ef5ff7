"""An installable plugin (the test writes its dist-info): importing the package registers nothing."""
