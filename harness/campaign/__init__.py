"""``flashcheck report``: the campaign plan (:mod:`~flashcheck.harness.campaign.plan`), its run
(:mod:`~flashcheck.harness.campaign.runner`, with the worst-case
:mod:`~flashcheck.harness.campaign.search` and the
:mod:`~flashcheck.harness.campaign.casefiles`), the records of its results file
(:mod:`~flashcheck.harness.campaign.logrecords`,
:mod:`~flashcheck.harness.campaign.resultrecords`), the report run and its gate
(:mod:`~flashcheck.harness.campaign.report`), and the markdown and figures rendered from the
results (:mod:`~flashcheck.harness.campaign.render`)."""
